// Measures the onednn backend in one run: LeNet-5 layer ops at batch 64 (forward and backward)
// against the reference backend, the convolutions in each activation layout, a 1024^3 matmul,
// and whole LeNet-5 training steps (forward, backward, SGD) in images per second.
//
// Usage: onednn_bench [--threads N] [--quick] [--cpu-clock]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cleave/core/random.h"
#include "onednn_backend.h"

namespace core = cleave::core;
using cleave::backend::detail::conv_layout;
using cleave::backend::detail::onednn_backend;
using cleave::backend::detail::onednn_options;
using cleave::backend::detail::reference_backend;
using core::shape;
using core::tensor;

namespace {

bool g_cpu_clock = false;

// Wall time, or with --cpu-clock the process's CPU time: with one thread that is immune to
// other processes sharing the cores (with more it also counts threads spinning at barriers).
double seconds() {
  if (g_cpu_clock) {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median over batches of the time per call, in microseconds; batches last >= ~`batch_s` each.
double time_us(const std::function<void()>& f, core::backend& b, double budget_s = 0.3) {
  f();  // first call: primitive creation
  b.synchronize();
  const double t0 = seconds();
  f();
  b.synchronize();
  const double one = std::max(seconds() - t0, 1e-7);
  const int n_batches = 9;
  const int per_batch = std::max(1, static_cast<int>(budget_s / n_batches / one));
  std::vector<double> t;
  for (int i = 0; i < n_batches; ++i) {
    const double s = seconds();
    for (int j = 0; j < per_batch; ++j) f();
    b.synchronize();
    t.push_back((seconds() - s) / per_batch * 1e6);
  }
  std::nth_element(t.begin(), t.begin() + n_batches / 2, t.end());
  return t[n_batches / 2];
}

tensor random_tensor(core::backend& b, const shape& s, core::rng& g, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(static_cast<std::size_t>(s.numel()));
  for (auto& e : v) e = g.uniform(lo, hi);
  tensor t = b.empty(s);
  b.upload(t, v.data());
  return t;
}

// LeNet-5 at batch N on one backend, every tensor allocated once.
struct lenet {
  static constexpr std::int64_t n = 64;
  core::backend& b;
  core::rng g{7};
  core::conv2d_desc c1{1, 1, 2, 2}, c2{1, 1, 0, 0};
  core::pool2d_desc pool{core::pool_kind::max, 2, 2, 2, 2, 0, 0};
  std::vector<tensor> params, grads, moms;
  tensor x, labels, a1, p1, a2, p2, a3, a4, logits, probs, loss, ws1, ws2;
  tensor dlogits, d4, d3, dflat, d2, dp1, d1;

  explicit lenet(core::backend& be) : b(be) {
    const shape shapes[] = {{6, 1, 5, 5}, {6}, {16, 6, 5, 5}, {16}, {120, 400}, {120}, {84, 120}, {84}, {10, 84}, {10}};
    for (const auto& s : shapes) {
      const float scale = s.rank() == 1 ? 0.1f : 1.0f / std::sqrt(static_cast<float>(s.numel_from(1)));
      params.push_back(random_tensor(b, s, g, -scale, scale));
      grads.push_back(b.zeros(s));
      moms.push_back(b.zeros(s));
    }
    x = random_tensor(b, {n, 1, 28, 28}, g, 0.0f, 1.0f);
    std::vector<std::int32_t> lab(n);
    for (auto& l : lab) l = static_cast<std::int32_t>(g.below(10));
    labels = b.empty({n}, core::dtype::i32);
    b.upload(labels, lab.data());
    a1 = b.empty({n, 6, 28, 28}), p1 = b.empty({n, 6, 14, 14});
    a2 = b.empty({n, 16, 10, 10}), p2 = b.empty({n, 16, 5, 5});
    a3 = b.empty({n, 120}), a4 = b.empty({n, 84}), logits = b.empty({n, 10});
    probs = b.empty({n, 10}), loss = b.empty({1});
    dlogits = b.empty({n, 10}), d4 = b.empty({n, 84}), d3 = b.empty({n, 120});
    dflat = b.empty({n, 400}), d2 = b.empty({n, 16, 10, 10}), dp1 = b.empty({n, 6, 14, 14});
    d1 = b.empty({n, 6, 28, 28});
  }

  void step() {
    b.conv2d_forward(c1, x, params[0], params[1], a1);
    b.relu_forward(a1, a1);
    b.pool2d_forward(pool, a1, p1, &ws1);
    b.conv2d_forward(c2, p1, params[2], params[3], a2);
    b.relu_forward(a2, a2);
    b.pool2d_forward(pool, a2, p2, &ws2);
    const auto flat = p2.reshaped({n, 400});
    b.linear_forward(flat, params[4], params[5], a3);
    b.relu_forward(a3, a3);
    b.linear_forward(a3, params[6], params[7], a4);
    b.relu_forward(a4, a4);
    b.linear_forward(a4, params[8], params[9], logits);
    b.softmax_xent_forward(logits, labels, probs, loss);

    for (auto& gr : grads) b.fill(gr, 0.0f);
    b.softmax_xent_backward(probs, labels, dlogits, 1.0f);
    b.linear_backward_weights(a4, dlogits, grads[8], grads[9]);
    b.linear_backward_data(dlogits, params[8], d4);
    b.relu_backward(a4, d4, d4);
    b.linear_backward_weights(a3, d4, grads[6], grads[7]);
    b.linear_backward_data(d4, params[6], d3);
    b.relu_backward(a3, d3, d3);
    b.linear_backward_weights(flat, d3, grads[4], grads[5]);
    b.linear_backward_data(d3, params[4], dflat);
    b.pool2d_backward(pool, a2, dflat.reshaped({n, 16, 5, 5}), ws2, d2);
    b.relu_backward(a2, d2, d2);
    b.conv2d_backward_weights(c2, p1, d2, grads[2], grads[3]);
    b.conv2d_backward_data(c2, d2, params[2], dp1);
    b.pool2d_backward(pool, a1, dp1, ws1, d1);
    b.relu_backward(a1, d1, d1);
    b.conv2d_backward_weights(c1, x, d1, grads[0], grads[1]);
    const core::sgd_desc sgd{0.05f, 0.9f, 0.0f, false};
    for (std::size_t i = 0; i < params.size(); ++i) b.sgd_update(sgd, params[i], grads[i], moms[i]);
  }
};

struct op_case {
  const char* name;
  double flops;  // 0: memory-bound op, GFLOP/s not shown
  std::function<void(lenet&)> run;
};

std::vector<op_case> lenet_ops() {
  const double n = lenet::n;
  const double conv1 = 2 * n * 6 * 28 * 28 * 1 * 25, conv2 = 2 * n * 16 * 10 * 10 * 6 * 25;
  const double fc1 = 2 * n * 400 * 120, fc2 = 2 * n * 120 * 84, fc3 = 2 * n * 84 * 10;
  return {
      {"conv1 fwd", conv1, [](lenet& l) { l.b.conv2d_forward(l.c1, l.x, l.params[0], l.params[1], l.a1); }},
      {"conv1 bwd weights", conv1,
       [](lenet& l) { l.b.conv2d_backward_weights(l.c1, l.x, l.d1, l.grads[0], l.grads[1]); }},
      {"relu1 fwd", 0, [](lenet& l) { l.b.relu_forward(l.a1, l.d1); }},
      {"relu1 bwd", 0, [](lenet& l) { l.b.relu_backward(l.a1, l.d1, l.d1); }},
      {"pool1 fwd (max 2x2)", 0, [](lenet& l) { l.b.pool2d_forward(l.pool, l.a1, l.p1, &l.ws1); }},
      {"pool1 bwd", 0, [](lenet& l) { l.b.pool2d_backward(l.pool, l.a1, l.dp1, l.ws1, l.d1); }},
      {"conv2 fwd", conv2, [](lenet& l) { l.b.conv2d_forward(l.c2, l.p1, l.params[2], l.params[3], l.a2); }},
      {"conv2 bwd data", conv2, [](lenet& l) { l.b.conv2d_backward_data(l.c2, l.d2, l.params[2], l.dp1); }},
      {"conv2 bwd weights", conv2,
       [](lenet& l) { l.b.conv2d_backward_weights(l.c2, l.p1, l.d2, l.grads[2], l.grads[3]); }},
      {"relu2 fwd", 0, [](lenet& l) { l.b.relu_forward(l.a2, l.d2); }},
      {"pool2 fwd (max 2x2)", 0, [](lenet& l) { l.b.pool2d_forward(l.pool, l.a2, l.p2, &l.ws2); }},
      {"pool2 bwd", 0,
       [](lenet& l) {
         l.b.pool2d_backward(l.pool, l.a2, l.dflat.reshaped({lenet::n, 16, 5, 5}), l.ws2, l.d2);
       }},
      {"fc1 fwd 400->120", fc1,
       [](lenet& l) {
         l.b.linear_forward(l.p2.reshaped({lenet::n, 400}), l.params[4], l.params[5], l.a3);
       }},
      {"fc1 bwd data", fc1, [](lenet& l) { l.b.linear_backward_data(l.d3, l.params[4], l.dflat); }},
      {"fc1 bwd weights", fc1,
       [](lenet& l) {
         l.b.linear_backward_weights(l.p2.reshaped({lenet::n, 400}), l.d3, l.grads[4], l.grads[5]);
       }},
      {"fc2 fwd 120->84", fc2, [](lenet& l) { l.b.linear_forward(l.a3, l.params[6], l.params[7], l.a4); }},
      {"fc2 bwd data", fc2, [](lenet& l) { l.b.linear_backward_data(l.d4, l.params[6], l.d3); }},
      {"fc2 bwd weights", fc2, [](lenet& l) { l.b.linear_backward_weights(l.a3, l.d4, l.grads[6], l.grads[7]); }},
      {"fc3 fwd 84->10", fc3, [](lenet& l) { l.b.linear_forward(l.a4, l.params[8], l.params[9], l.logits); }},
      {"fc3 bwd data", fc3, [](lenet& l) { l.b.linear_backward_data(l.dlogits, l.params[8], l.d4); }},
      {"fc3 bwd weights", fc3, [](lenet& l) { l.b.linear_backward_weights(l.a4, l.dlogits, l.grads[8], l.grads[9]); }},
      {"softmax xent fwd+bwd", 0,
       [](lenet& l) {
         l.b.softmax_xent_forward(l.logits, l.labels, l.probs, l.loss);
         l.b.softmax_xent_backward(l.probs, l.labels, l.dlogits, 1.0f);
       }},
      {"sgd momentum (all 61.7k params)", 0,
       [](lenet& l) {
         const core::sgd_desc sgd{0.0f, 0.9f, 0.0f, false};
         for (std::size_t i = 0; i < l.params.size(); ++i) l.b.sgd_update(sgd, l.params[i], l.grads[i], l.moms[i]);
       }},
  };
}

const char* layout_name(conv_layout c) {
  switch (c) {
    case conv_layout::automatic:
      return "auto";
    case conv_layout::blocked:
      return "blocked";
    case conv_layout::nhwc:
      return "nhwc";
    case conv_layout::nchw:
      return "nchw";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  int n_threads = 2;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      n_threads = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--cpu-clock")) {
      g_cpu_clock = true;
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--quick] [--cpu-clock]\n", argv[0]);
      return 2;
    }
  }
  const double budget = quick ? 0.05 : 0.3;

  onednn_backend dnn(onednn_options{.n_threads = n_threads});
  reference_backend ref;
  std::printf("onednn: %s\n\n", dnn.device_name().c_str());

  // First call of a new shape: primitive creation and JIT.
  {
    core::rng g(1);
    auto x = random_tensor(dnn, {64, 1, 28, 28}, g), w = random_tensor(dnn, {6, 1, 5, 5}, g);
    auto y = dnn.empty({64, 6, 28, 28});
    const double t0 = seconds();
    dnn.conv2d_forward({1, 1, 2, 2}, x, w, tensor(), y);
    const double first = (seconds() - t0) * 1e3;
    const double t1 = seconds();
    dnn.conv2d_forward({1, 1, 2, 2}, x, w, tensor(), y);
    std::printf("conv1 forward, first call %.1f ms, second call %.3f ms\n\n", first, (seconds() - t1) * 1e3);
  }

  std::printf("LeNet-5 layer ops, batch 64 (median us per call)\n");
  std::printf("%-34s %10s %9s %12s %9s\n", "op", "onednn us", "GFLOP/s", "reference us", "speedup");
  lenet ld(dnn), lr(ref);
  ld.step();
  lr.step();
  double sum_dnn = 0.0;
  for (const auto& op : lenet_ops()) {
    const double td = time_us([&] { op.run(ld); }, dnn, budget);
    const double tr = time_us([&] { op.run(lr); }, ref, quick ? 0.02 : 0.1);
    sum_dnn += td;
    if (op.flops > 0)
      std::printf("%-34s %10.1f %9.1f %12.1f %8.1fx\n", op.name, td, op.flops / td / 1e3, tr, tr / td);
    else
      std::printf("%-34s %10.1f %9s %12.1f %8.1fx\n", op.name, td, "-", tr, tr / td);
  }
  std::printf("%-34s %10.1f\n\n", "sum of the ops above", sum_dnn);

  std::printf("LeNet-5 convolutions by activation layout (us per call; auto = what the backend picks)\n");
  const conv_layout layouts[] = {conv_layout::automatic, conv_layout::blocked, conv_layout::nhwc, conv_layout::nchw};
  std::printf("%-20s", "op");
  for (auto c : layouts) std::printf(" %9s", layout_name(c));
  std::printf("\n");
  std::vector<std::unique_ptr<onednn_backend>> by_layout;
  std::vector<std::unique_ptr<lenet>> nets;
  for (auto c : layouts) {
    by_layout.push_back(std::make_unique<onednn_backend>(onednn_options{.n_threads = n_threads, .layout = c}));
    nets.push_back(std::make_unique<lenet>(*by_layout.back()));
  }
  for (const auto& op : lenet_ops()) {
    if (std::strncmp(op.name, "conv", 4) != 0) continue;
    std::printf("%-20s", op.name);
    for (std::size_t i = 0; i < nets.size(); ++i)
      std::printf(" %9.1f", time_us([&] { op.run(*nets[i]); }, *by_layout[i], budget));
    std::printf("\n");
  }
  std::printf("%-20s", "training step");
  for (std::size_t i = 0; i < nets.size(); ++i)
    std::printf(" %9.1f", time_us([&] { nets[i]->step(); }, *by_layout[i], budget * 2));
  std::printf("\n\n");

  std::printf("ResNet-18 3x3 convolutions on 28x28 inputs, batch 64: winograd (default) vs direct (us per call)\n");
  std::printf("%-26s %10s %10s %10s %10s %10s %10s %7s\n", "channels at size", "fwd wino", "direct", "bwd-d wino",
              "direct", "bwd-w wino", "direct", "ratio");
  {
    onednn_backend direct(
        onednn_options{.n_threads = n_threads, .conv = cleave::backend::detail::conv_algorithm::direct});
    struct shape_case {
      std::int64_t c, hw;
    };
    const shape_case cases[] = {{64, 28}, {128, 14}, {256, 7}, {512, 4}};
    double sum_w = 0, sum_d = 0;
    for (const auto& sc : cases) {
      core::rng g(3);
      const core::conv2d_desc d{1, 1, 1, 1};
      const core::shape sx{64, sc.c, sc.hw, sc.hw}, sw{sc.c, sc.c, 3, 3};
      auto x = random_tensor(dnn, sx, g), w = random_tensor(dnn, sw, g), y = dnn.empty(sx), dx = dnn.empty(sx),
           dw = dnn.empty(sw);
      auto x2 = random_tensor(direct, sx, g), w2 = random_tensor(direct, sw, g), y2 = direct.empty(sx),
           dx2 = direct.empty(sx), dw2 = direct.empty(sw);
      const double t[6] = {time_us([&] { dnn.conv2d_forward(d, x, w, tensor(), y); }, dnn, budget),
                           time_us([&] { direct.conv2d_forward(d, x2, w2, tensor(), y2); }, direct, budget),
                           time_us([&] { dnn.conv2d_backward_data(d, y, w, dx); }, dnn, budget),
                           time_us([&] { direct.conv2d_backward_data(d, y2, w2, dx2); }, direct, budget),
                           time_us([&] { dnn.conv2d_backward_weights(d, x, y, dw, tensor()); }, dnn, budget),
                           time_us([&] { direct.conv2d_backward_weights(d, x2, y2, dw2, tensor()); }, direct, budget)};
      const double tw = t[0] + t[2] + t[4], td = t[1] + t[3] + t[5];
      sum_w += tw;
      sum_d += td;
      const std::string name = std::to_string(sc.c) + " at " + std::to_string(sc.hw) + "x" + std::to_string(sc.hw);
      std::printf("%-26s %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %6.2fx\n", name.c_str(), t[0], t[1], t[2], t[3],
                  t[4], t[5], td / tw);
    }
    std::printf("%-26s %65s %6.2fx  (direct / winograd, all three ops)\n", "all", "", sum_d / sum_w);
    std::printf("  plans running winograd: %zu\n\n", dnn.n_cached_running("wino"));
  }

  std::printf("LeNet-5 pooling (2x2, stride 2): loops (default) vs oneDNN primitive (us per call)\n");
  std::printf("%-20s %9s %9s\n", "op", "loops", "primitive");
  onednn_backend prim(onednn_options{.n_threads = n_threads, .pooling = cleave::backend::detail::pool_impl::primitive});
  lenet lp(prim);
  lp.step();
  for (const auto& op : lenet_ops()) {
    if (std::strncmp(op.name, "pool", 4) != 0) continue;
    std::printf("%-20.20s %9.1f %9.1f\n", op.name, time_us([&] { op.run(ld); }, dnn, budget),
                time_us([&] { op.run(lp); }, prim, budget));
  }
  std::printf("%-20s %9.1f %9.1f\n\n", "training step", time_us([&] { ld.step(); }, dnn, budget * 2),
              time_us([&] { lp.step(); }, prim, budget * 2));

  {
    core::rng g(2);
    const std::int64_t m = 1024;
    auto a = random_tensor(dnn, {m, m}, g), bm = random_tensor(dnn, {m, m}, g);
    auto c = dnn.empty({m, m});
    onednn_backend one(onednn_options{.n_threads = 1});
    auto a1 = random_tensor(one, {m, m}, g), b1 = random_tensor(one, {m, m}, g);
    auto c1 = one.empty({m, m});
    const double flops = 2.0 * m * m * m;
    const double t = time_us([&] { dnn.matmul(a, bm, c, false, false, 1.0f, 0.0f); }, dnn, budget * 3);
    const double t1 = time_us([&] { one.matmul(a1, b1, c1, false, false, 1.0f, 0.0f); }, one, budget * 3);
    std::printf("matmul 1024^3: %.1f GFLOP/s on %d threads (%.2f ms), %.1f GFLOP/s on 1 thread\n\n", flops / t / 1e3,
                dnn.n_threads(), t / 1e3, flops / t1 / 1e3);
  }

  std::printf("LeNet-5 training step, batch 64 (forward, backward, SGD momentum)\n");
  const double step_dnn = time_us([&] { ld.step(); }, dnn, budget * 3);
  onednn_backend all(onednn_options{.n_threads = n_threads, .min_parallel_work = 0.0});
  lenet la(all);
  const double step_all = time_us([&] { la.step(); }, all, budget * 3);
  onednn_backend one(onednn_options{.n_threads = 1});
  lenet l1(one);
  const double step_one = time_us([&] { l1.step(); }, one, budget * 3);
  const double step_ref = time_us([&] { lr.step(); }, ref, quick ? 0.1 : 1.0);
  const auto line = [](const char* what, double us) {
    std::printf("  %-44s %8.3f ms/step %9.0f images/s\n", what, us / 1e3, lenet::n / (us / 1e6));
  };
  const std::string t = std::to_string(dnn.n_threads());
  line(("onednn " + t + " threads (small ops on 1, default)").c_str(), step_dnn);
  line(("onednn " + t + " threads for every op").c_str(), step_all);
  line("onednn 1 thread", step_one);
  line("reference", step_ref);
  std::printf("  onednn default vs reference: %.0fx; primitives cached: %zu\n", step_ref / step_dnn, dnn.n_cached());
  return 0;
}
