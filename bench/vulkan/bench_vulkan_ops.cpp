// Measures GFLOP/s of matmul and of conv2d forward / backward data / backward weights on the
// vulkan backend and on the other backends the registry has (onednn where built; reference
// with --with-reference), on LeNet-5 and small-ResNet shapes and one bigger matmul, and prints
// each backend's figure and its ratio to vulkan's, all measured in this one run.
// Usage: bench_vulkan_ops [--backends vulkan,onednn,...] [--matmul N] [--min-time S] [--with-reference]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cleave/backend/registry.h"
#include "cleave/core/backend.h"
#include "cleave/core/error.h"
#include "cleave/core/random.h"

namespace {

using namespace cleave;
using core::shape;
using core::tensor;

struct bench_case {
  std::string op, desc;
  double flops;
  // Sets up tensors on a backend and returns the op to time.
  std::function<std::function<void()>(core::backend&)> prepare;
};

tensor random_tensor(core::backend& b, const shape& s, std::uint64_t seed) {
  core::rng r(seed);
  std::vector<float> v(static_cast<std::size_t>(s.numel()));
  for (auto& x : v) x = r.uniform(-1.0f, 1.0f);
  tensor t = b.empty(s);
  b.upload(t, v.data());
  return t;
}

std::vector<bench_case> make_cases(std::int64_t big) {
  std::vector<bench_case> cases;
  auto add_matmul = [&](std::int64_t m, std::int64_t n, std::int64_t k, bool tb, const std::string& what) {
    cases.push_back({"matmul",
                     what + " " + std::to_string(m) + "x" + std::to_string(k) + (tb ? " * T" : " * ") +
                         std::to_string(k) + "x" + std::to_string(n),
                     2.0 * m * n * k, [=](core::backend& b) -> std::function<void()> {
                       tensor a = random_tensor(b, {m, k}, 1);
                       tensor w = tb ? random_tensor(b, {n, k}, 2) : random_tensor(b, {k, n}, 2);
                       tensor c = b.empty({m, n});
                       return [&b, a, w, c, tb] { b.matmul(a, w, c, false, tb, 1.0f, 0.0f); };
                     }});
  };
  add_matmul(64, 120, 400, true, "LeNet fc1");
  add_matmul(256, 256, 256, false, "square");
  add_matmul(big, big, big, false, "big");

  struct conv {
    const char* what;
    std::int64_t n, c, h, w, k, r;
    int stride, pad;
  };
  const conv convs[] = {
      {"LeNet conv1", 64, 1, 28, 28, 6, 5, 1, 2},         {"LeNet conv2", 64, 6, 14, 14, 16, 5, 1, 0},
      {"ResNet 16ch 32x32", 32, 16, 32, 32, 16, 3, 1, 1}, {"ResNet 32ch s2", 32, 16, 32, 32, 32, 3, 2, 1},
      {"ResNet 64ch 8x8", 32, 64, 8, 8, 64, 3, 1, 1},
  };
  for (const auto& cv : convs) {
    const core::conv2d_desc d{cv.stride, cv.stride, cv.pad, cv.pad};
    const std::int64_t p = core::window_out(cv.h, static_cast<int>(cv.r), cv.stride, cv.pad);
    const std::int64_t q = core::window_out(cv.w, static_cast<int>(cv.r), cv.stride, cv.pad);
    const double flops = 2.0 * cv.n * cv.k * p * q * cv.c * cv.r * cv.r;
    const std::string desc = std::string(cv.what) + " N" + std::to_string(cv.n) + " C" + std::to_string(cv.c) + " " +
                             std::to_string(cv.h) + "x" + std::to_string(cv.w) + " K" + std::to_string(cv.k) + " " +
                             std::to_string(cv.r) + "x" + std::to_string(cv.r);
    const shape xs{cv.n, cv.c, cv.h, cv.w}, ws{cv.k, cv.c, cv.r, cv.r}, ys{cv.n, cv.k, p, q};
    cases.push_back({"conv fwd", desc, flops, [=](core::backend& b) -> std::function<void()> {
                       tensor x = random_tensor(b, xs, 1), w = random_tensor(b, ws, 2),
                              bias = random_tensor(b, {cv.k}, 3);
                       tensor y = b.empty(ys);
                       return [&b, d, x, w, bias, y] { b.conv2d_forward(d, x, w, bias, y); };
                     }});
    cases.push_back({"conv bwd data", desc, flops, [=](core::backend& b) -> std::function<void()> {
                       tensor dy = random_tensor(b, ys, 1), w = random_tensor(b, ws, 2);
                       tensor dx = b.empty(xs);
                       return [&b, d, dy, w, dx] { b.conv2d_backward_data(d, dy, w, dx); };
                     }});
    cases.push_back({"conv bwd weights", desc, flops, [=](core::backend& b) -> std::function<void()> {
                       tensor x = random_tensor(b, xs, 1), dy = random_tensor(b, ys, 2);
                       tensor dw = b.zeros(ws), db = b.zeros({cv.k});
                       return [&b, d, x, dy, dw, db] { b.conv2d_backward_weights(d, x, dy, dw, db); };
                     }});
  }
  return cases;
}

// Seconds per call: one warm-up call (pipeline and JIT compilation), then repeated batches of
// calls until min_time has passed; the backend is synchronised before the clock stops.
double time_op(core::backend& b, const std::function<void()>& op, double min_time) {
  using clock = std::chrono::steady_clock;
  op();
  b.synchronize();
  std::int64_t calls = 0;
  std::int64_t batch = 1;
  const auto t0 = clock::now();
  double elapsed = 0.0;
  while (elapsed < min_time) {
    for (std::int64_t i = 0; i < batch; ++i) op();
    b.synchronize();
    calls += batch;
    elapsed = std::chrono::duration<double>(clock::now() - t0).count();
    batch = std::min<std::int64_t>(batch * 2, 64);
  }
  return elapsed / static_cast<double>(calls);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const auto comma = s.find(',', start);
    const auto end = comma == std::string::npos ? s.size() : comma;
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string names;
  std::int64_t big = 1024;
  double min_time = 0.5;
  bool with_reference = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--backends" && i + 1 < argc) {
      names = argv[++i];
    } else if (a == "--matmul" && i + 1 < argc) {
      big = std::stoll(argv[++i]);
    } else if (a == "--min-time" && i + 1 < argc) {
      min_time = std::stod(argv[++i]);
    } else if (a == "--with-reference") {
      with_reference = true;
    } else {
      std::fprintf(stderr, "usage: bench_vulkan_ops [--backends a,b] [--matmul N] [--min-time S] [--with-reference]\n");
      return 2;
    }
  }
  std::vector<std::string> chosen;
  if (!names.empty()) {
    chosen = split(names);
  } else {
    for (const auto& info : backend::list_backends()) {
      if (!info.available || (info.name == "reference" && !with_reference)) continue;
      chosen.push_back(info.name);
    }
  }
  // vulkan first: ratios are to vulkan.
  std::stable_partition(chosen.begin(), chosen.end(), [](const auto& n) { return n.rfind("vulkan", 0) == 0; });
  std::vector<std::unique_ptr<core::backend>> backends;
  for (const auto& n : chosen) {
    try {
      backends.push_back(backend::make_backend(n));
      std::printf("# %-10s %s\n", n.c_str(), backends.back()->device_name().c_str());
    } catch (const core::error& e) {
      std::printf("# %-10s unavailable: %s\n", n.c_str(), e.what());
    }
  }
  if (backends.empty()) {
    std::fprintf(stderr, "bench_vulkan_ops: no backend to measure\n");
    return 1;
  }
  std::printf("%-17s %-42s", "op", "shape");
  for (const auto& b : backends) std::printf(" %12s", (b->name() + " GF/s").c_str());
  for (std::size_t i = 1; i < backends.size(); ++i)
    std::printf(" %16s", (backends[i]->name() + "/" + backends[0]->name()).c_str());
  std::printf("\n");
  for (const auto& c : make_cases(big)) {
    std::printf("%-17s %-42s", c.op.c_str(), c.desc.c_str());
    std::fflush(stdout);
    std::vector<double> gflops;
    for (const auto& b : backends) {
      const auto op = c.prepare(*b);
      const double secs = time_op(*b, op, min_time);
      gflops.push_back(c.flops / secs * 1e-9);
      std::printf(" %12.2f", gflops.back());
      std::fflush(stdout);
    }
    for (std::size_t i = 1; i < gflops.size(); ++i) std::printf(" %16.2f", gflops[i] / gflops[0]);
    std::printf("\n");
  }
  return 0;
}
