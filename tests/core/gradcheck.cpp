// Finite-difference gradient checks: every layer's backward (input and parameter gradients)
// against central differences of its forward, on every available backend.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>

#include "../support/backend_harness.h"
#include "cleave/core/stage.h"

namespace {

using namespace cleave;
using core::shape;
using core::tensor;

std::vector<std::string> all_backends() {
  std::vector<std::string> v{"reference"};
  for (auto& n : testing::backends_under_test()) v.push_back(n);
  return v;
}

core::backend& get(const std::string& name) {
  static std::map<std::string, std::unique_ptr<core::backend>> cache;
  auto& slot = cache[name];
  if (!slot) slot = backend::make_backend(name);
  return *slot;
}

std::string input_json(const shape& s) {
  std::string r = "[";
  for (int i = 0; i < s.rank(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

// A model whose block 0 is the layer under test; the head only makes the spec complete.
core::model_spec one_block(const std::string& block, const shape& in) {
  return core::parse_model_spec(R"({"input":)" + input_json(in) + R"(,"classes":3,"blocks":[)" + block +
                                    R"(,{"type":"flatten"},{"type":"linear","out_features":3}]})",
                                "gradcheck");
}

struct probe {
  core::backend& b;
  core::stage& st;
  tensor x;              // (N, in...)
  std::vector<float> r;  // dL/dy: L = sum(y * r)
  std::uint32_t seed = 77;

  double loss() {
    core::stage::context ctx;
    tensor y = st.forward(x, ctx, core::mode::train, seed);
    const auto v = testing::read(b, y);
    double l = 0.0;
    for (std::size_t i = 0; i < v.size(); ++i) l += static_cast<double>(v[i]) * r[i];
    return l;
  }
};

// Perturbs element i of t (through the host) and returns the central difference, or NaN
// where the two one-sided differences disagree: the step crossed a kink (ReLU, max) inside
// the layer, where no derivative exists to compare with.
double numeric(probe& p, const tensor& t, std::size_t i, double eps, const std::function<void()>& reset) {
  auto v = testing::read(p.b, t);
  const float orig = v[i];
  auto at = [&](double delta) {
    v[i] = static_cast<float>(orig + delta);
    p.b.upload(t, v.data());
    reset();
    return p.loss();
  };
  const double up = at(eps), mid = at(0.0), down = at(-eps);
  v[i] = orig;
  p.b.upload(t, v.data());
  const double right = (up - mid) / eps, left = (mid - down) / eps;
  if (std::fabs(right - left) > 0.02 * std::fabs(right + left) + 5e-3) return std::nan("");
  return (up - down) / (2.0 * eps);
}

// Inputs: well-separated distinct values (a shuffled ramp) so that max pooling and ReLU stay
// away from their kinks under a perturbation of eps.
std::vector<float> separated_inputs(std::int64_t n, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  core::rng r(seed);
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] =
        static_cast<float>(i - n / 2) * (2.0f / static_cast<float>(n)) + 0.5f / static_cast<float>(n);
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[r.below(i)]);
  return v;
}

void check_layer(const std::string& block, const shape& in, std::int64_t batch = 2, double eps = 1e-3) {
  const auto m = one_block(block, in);
  for (const auto& name : all_backends()) {
    SUBCASE(name.c_str()) {
      core::backend& b = get(name);
      core::stage st(b, m, 0, 1, 5);
      const shape xs = in.rank() == 3 ? shape{batch, in[0], in[1], in[2]} : shape{batch, in[0]};
      const shape ys = m.blocks[0].out.rank() == 3
                           ? shape{batch, m.blocks[0].out[0], m.blocks[0].out[1], m.blocks[0].out[2]}
                           : shape{batch, m.blocks[0].out[0]};
      // Scale inputs up so gaps between values (2/n * 4) exceed 2 eps comfortably.
      auto xv = separated_inputs(xs.numel(), 9);
      for (auto& v : xv) v *= 4.0f;
      probe p{b, st, testing::make(b, xs, xv), testing::random_vec(ys.numel(), 10)};
      // The running statistics change on every training forward; restore them each time.
      const auto buffers0 = testing::read(b, st.buffers());
      const auto reset = [&] {
        if (!buffers0.empty()) b.upload(st.buffers(), buffers0.data());
      };

      // Analytic gradients.
      st.zero_grad();
      core::stage::context ctx;
      reset();
      tensor y = st.forward(p.x, ctx, core::mode::train, p.seed);
      REQUIRE(y.shape() == ys);
      tensor dx = st.backward(testing::make(b, ys, p.r), ctx, true);
      const auto dxv = testing::read(b, dx);
      const auto dpv = testing::read(b, st.grads());

      core::rng pick(3);
      auto check = [&](const tensor& t, const std::vector<float>& analytic, const std::string& what) {
        const std::size_t n = analytic.size();
        int n_checked = 0, n_kinks = 0;
        for (int k = 0; k < std::min<int>(24, static_cast<int>(n)); ++k) {
          const std::size_t i = n <= 24 ? static_cast<std::size_t>(k) : pick.below(n);
          const double num = numeric(p, t, i, eps, reset);
          if (std::isnan(num)) {
            ++n_kinks;
            continue;
          }
          ++n_checked;
          const double err = std::fabs(num - analytic[i]);
          INFO(name << " " << block << ": d" << what << "[" << i << "] analytic " << analytic[i] << " numeric " << num);
          CHECK(err <= 2e-2 * std::fabs(num) + 2e-3);
        }
        INFO(name << " " << block << ": d" << what << ": " << n_kinks << " samples fell on a kink");
        CHECK(n_kinks * 4 <= n_checked);
      };
      check(p.x, dxv, "x");
      if (st.n_params()) check(st.params(), dpv, "params");
    }
  }
}

}  // namespace

TEST_CASE("linear gradients match finite differences") {
  check_layer(R"({"type":"linear","out_features":5})", shape{7});
}

TEST_CASE("conv2d gradients match finite differences") {
  check_layer(R"({"type":"conv2d","out_channels":3,"kernel":3,"padding":1})", shape{2, 5, 4});
  check_layer(R"({"type":"conv2d","out_channels":2,"kernel":[3,2],"stride":2,"bias":false})", shape{3, 7, 6});
}

TEST_CASE("grouped and depthwise conv2d gradients match finite differences") {
  check_layer(R"({"type":"conv2d","out_channels":4,"kernel":3,"padding":1,"groups":2})", shape{4, 4, 4});
  check_layer(R"({"type":"conv2d","out_channels":3,"kernel":3,"stride":2,"padding":1,"groups":3,"bias":false})",
              shape{3, 5, 5});
  check_layer(R"({"type":"conv2d","out_channels":6,"kernel":[1,3],"groups":3})", shape{3, 1, 7});
}

TEST_CASE("pooling gradients match finite differences") {
  check_layer(R"({"type":"maxpool2d","kernel":2})", shape{2, 4, 6});
  check_layer(R"({"type":"maxpool2d","kernel":3,"stride":2,"padding":1})", shape{2, 5, 5});
  check_layer(R"({"type":"avgpool2d","kernel":2})", shape{2, 4, 4});
  check_layer(R"({"type":"global_avg_pool"})", shape{3, 3, 3});
}

TEST_CASE("relu, clamp, relu6, flatten and dropout gradients match finite differences") {
  check_layer(R"({"type":"relu"})", shape{3, 2, 5});
  // Inputs span [-4, 4]: clamp(-1, 2) has inputs beyond both bounds, relu6 below its lower one.
  check_layer(R"({"type":"clamp","min":-1,"max":2})", shape{3, 2, 5});
  check_layer(R"({"type":"relu6"})", shape{3, 2, 5});
  check_layer(R"({"type":"flatten"})", shape{2, 3, 3});
  check_layer(R"({"type":"dropout","p":0.3})", shape{40});
}

TEST_CASE("batch norm gradients match finite differences in training mode") {
  check_layer(R"({"type":"batchnorm2d"})", shape{3, 3, 3}, 3);
  check_layer(R"({"type":"batchnorm2d"})", shape{4}, 6);
}

TEST_CASE("residual block gradients match finite differences") {
  // Inner ReLUs would put kinks under most weight perturbations; batch norm keeps it smooth.
  check_layer(R"({"type":"residual","body":[{"type":"conv2d","out_channels":2,"kernel":3,"padding":1},
              {"type":"batchnorm2d"},{"type":"conv2d","out_channels":2,"kernel":3,"padding":1}]})",
              shape{2, 4, 4}, 3);
  check_layer(R"({"type":"residual","body":[{"type":"conv2d","out_channels":3,"kernel":3,"stride":2,"padding":1},
              {"type":"batchnorm2d"}],"shortcut":[{"type":"conv2d","out_channels":3,"kernel":1,"stride":2}]})",
              shape{2, 5, 5}, 3);
}

TEST_CASE("softmax cross-entropy gradient matches finite differences") {
  for (const auto& name : all_backends()) {
    SUBCASE(name.c_str()) {
      core::backend& b = get(name);
      const std::int64_t n = 4, k = 5;
      auto lv = testing::random_vec(n * k, 1, -3.0f, 3.0f);
      const std::vector<std::int32_t> labels{0, 3, 4, 1};
      tensor logits = testing::make(b, {n, k}, lv);
      tensor lab = testing::make_typed(b, {n}, core::dtype::i32, labels);
      const auto r = core::loss_forward(b, logits, lab);
      const auto d = testing::read(b, core::loss_backward(b, r, lab, 1.0f));
      for (std::size_t i = 0; i < lv.size(); ++i) {
        auto at = [&](float delta) {
          auto v = lv;
          v[i] += delta;
          b.upload(logits, v.data());
          return static_cast<double>(testing::read(b, core::loss_forward(b, logits, lab).loss)[0]);
        };
        const double num = (at(1e-2f) - at(-1e-2f)) / 2e-2;
        INFO(name << " dlogits[" << i << "] analytic " << d[i] << " numeric " << num);
        CHECK(std::fabs(num - d[i]) <= 1e-2 * std::fabs(num) + 1e-3);
      }
    }
  }
}
