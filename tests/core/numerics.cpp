// Known values of the reference backend, conversions, and seeded determinism.
#include <doctest/doctest.h>

#include "../support/backend_harness.h"
#include "cleave/core/convert.h"
#include "cleave/core/trainer.h"

using namespace cleave;
using core::shape;

TEST_CASE("the reference convolution and pooling give hand-computed values") {
  auto b = backend::make_backend("reference");
  // x = 1..9 in a 3x3 plane, w = all ones 2x2, bias 0.5, stride 1, no padding.
  auto x = testing::make(*b, {1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  auto w = testing::make(*b, {1, 1, 2, 2}, {1, 1, 1, 1});
  auto bias = testing::make(*b, {1}, {0.5f});
  auto y = b->empty({1, 1, 2, 2});
  b->conv2d_forward({}, x, w, bias, y);
  CHECK(testing::read(*b, y) == std::vector<float>{12.5f, 16.5f, 24.5f, 28.5f});
  auto p = b->empty({1, 1, 1, 1});
  b->pool2d_forward({core::pool_kind::max, 2, 2, 2, 2, 0, 0}, x, p, nullptr);
  CHECK(testing::read(*b, p)[0] == 5.0f);
  b->pool2d_forward({core::pool_kind::avg, 3, 3, 1, 1, 0, 0}, x, p, nullptr);
  CHECK(testing::read(*b, p)[0] == 5.0f);
}

TEST_CASE("the reference softmax cross-entropy gives the closed-form loss") {
  auto b = backend::make_backend("reference");
  auto logits = testing::make(*b, {1, 2}, {0.0f, 0.0f});
  auto lab = testing::make_typed(*b, {1}, core::dtype::i32, std::vector<std::int32_t>{1});
  const auto r = core::loss_forward(*b, logits, lab);
  CHECK(testing::read(*b, r.loss)[0] == doctest::Approx(std::log(2.0)).epsilon(1e-6));
  CHECK(testing::read(*b, core::loss_backward(*b, r, lab)) == std::vector<float>{0.5f, -0.5f});
}

TEST_CASE("f16 and bf16 conversions round to nearest even and handle the edges") {
  CHECK(core::f32_to_f16(1.0f) == 0x3c00);
  CHECK(core::f32_to_f16(65504.0f) == 0x7bff);
  CHECK(core::f32_to_f16(65520.0f) == 0x7c00);               // rounds up to inf
  CHECK(core::f32_to_f16(1.0f + 1.0f / 2048.0f) == 0x3c00);  // tie to even
  CHECK(core::f32_to_f16(5.9604645e-8f) == 0x0001);          // smallest subnormal
  CHECK(core::f16_to_f32(0x0001) == 5.9604645e-8f);
  CHECK(core::f32_to_bf16(1.0f) == 0x3f80);
  CHECK(core::f32_to_bf16(1.00390625f) == 0x3f80);  // tie to even
  CHECK(core::f32_to_bf16(1.01171875f) == 0x3f82);  // tie to even (upwards)
  CHECK(std::isnan(core::bf16_to_f32(core::f32_to_bf16(std::nanf("")))));
  for (std::uint32_t h = 0; h < 0x7c00; ++h)
    CHECK(core::f32_to_f16(core::f16_to_f32(static_cast<std::uint16_t>(h))) == h);
  CHECK(core::f32_to_int_sat(2.5f, -128, 127) == 2);
  CHECK(core::f32_to_int_sat(-300.0f, -128, 127) == -128);
}

TEST_CASE("the same seed gives the same initial weights wherever the cut falls") {
  const auto m = core::zoo_model("lenet5", shape{1, 28, 28}, 10);
  std::vector<float> all, all_s, a, a_s, b, b_s;
  core::initial_values(m, 0, m.n_blocks(), 42, all, all_s);
  core::initial_values(m, 0, 4, 42, a, a_s);
  core::initial_values(m, 4, m.n_blocks(), 42, b, b_s);
  a.insert(a.end(), b.begin(), b.end());
  CHECK(a == all);
  std::vector<float> other, other_s;
  core::initial_values(m, 0, m.n_blocks(), 43, other, other_s);
  CHECK(other != all);
}

TEST_CASE("training steps agree across backends") {
  const auto m = core::zoo_model("lenet5", shape{1, 28, 28}, 10);
  core::train_config c;
  c.seed = 5;
  const std::int64_t n = 16;
  const auto x = testing::random_vec(n * 784, 8);
  std::vector<std::int32_t> y(n);
  for (std::int64_t i = 0; i < n; ++i) y[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i % 10);
  auto ref = backend::make_backend("reference");
  core::trainer tr(*ref, m, c);
  for (int s = 0; s < 3; ++s) tr.step(x.data(), y.data(), n);
  const auto want = testing::read(*ref, tr.model_stage().params());
  for (const auto& name : testing::backends_under_test()) {
    SUBCASE(name.c_str()) {
      auto be = backend::make_backend(name);
      core::trainer t(*be, m, c);
      for (int s = 0; s < 3; ++s) t.step(x.data(), y.data(), n);
      CLEAVE_CHECK_CLOSE(testing::read(*be, t.model_stage().params()), want, 1e-3f, 1e-5f, name << " parameters");
    }
  }
}
