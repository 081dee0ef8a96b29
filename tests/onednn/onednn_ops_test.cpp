// The onednn backend's own ops against the reference backend, on random inputs shaped like
// LeNet-5's and a small ResNet's layers, plus odd sizes, strides and paddings.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "../support/error_of.h"
#include "cleave/backend/registry.h"
#include "cleave/core/dataset.h"
#include "cleave/core/model.h"
#include "cleave/core/trainer.h"
#include "dnnl_check.h"
#include "host_buffer.h"
#include "test_util.h"

using cleave::core::shape;
using cleave::core::tensor;
using namespace cleave::test;
namespace core = cleave::core;

namespace {

constexpr double tol = 1e-5;

struct conv_case {
  const char* name;
  std::int64_t n, c, h, w, k, r, s;
  int stride_h, stride_w, pad_h, pad_w;
};

// Covers every branch of the layout choice: C < 4, 4 <= C < 16, C % 16 == 0 and other C.
const conv_case conv_cases[] = {
    {"lenet conv1 6@5x5 pad 2", 64, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2},
    {"lenet conv2 16@5x5", 64, 6, 14, 14, 16, 5, 5, 1, 1, 0, 0},
    {"resnet stem 3x3 pad 1", 8, 3, 16, 16, 16, 3, 3, 1, 1, 1, 1},
    {"resnet 3x3 pad 1 stride 1", 4, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1},
    {"resnet 3x3 pad 1 stride 2", 4, 16, 8, 8, 32, 3, 3, 2, 2, 1, 1},
    {"resnet-18 3x3 64 -> 128 at 14x14 (winograd)", 4, 64, 14, 14, 128, 3, 3, 1, 1, 1, 1},
    {"3x3 at 3x3 outputs (direct: too small for winograd's tiles)", 2, 32, 3, 3, 32, 3, 3, 1, 1, 1, 1},
    // Few channels (own loops): widths with a tail, exactly 16, one vector's tail only; windows
    // wider than tall; a padding as large as the window (backward data then on oneDNN).
    {"narrow 3 -> 8, 3x5 window, width 37", 3, 3, 9, 37, 8, 3, 5, 1, 1, 1, 2},
    {"narrow 2 -> 5, 3x3, width 16, no padding", 2, 2, 6, 18, 5, 3, 3, 1, 1, 0, 0},
    {"narrow 1 -> 3, 2x2 window, padding 1", 3, 1, 5, 7, 3, 2, 2, 1, 1, 1, 1},
    {"narrow 4 -> 7, 3x3, padding 3", 2, 4, 6, 6, 7, 3, 3, 1, 1, 3, 3},
    {"narrow backward data 8 <- 32, 5x5 pad 2, width 20", 2, 8, 20, 20, 32, 5, 5, 1, 1, 2, 2},
    {"narrow backward data 3 <- 7, 3x3 pad 1, width 33", 3, 3, 4, 33, 7, 3, 3, 1, 1, 1, 1},
    {"resnet 1x1 stride 2 shortcut", 4, 16, 8, 8, 32, 1, 1, 2, 2, 0, 0},
    {"24 channels 3x3", 2, 24, 6, 6, 8, 3, 3, 1, 1, 1, 1},
    {"odd sizes, unequal stride and padding", 3, 5, 7, 9, 7, 3, 2, 2, 1, 1, 0},
    {"stride that leaves the last rows unused", 2, 4, 6, 5, 3, 2, 2, 2, 2, 0, 0},
};

}  // namespace

TEST_CASE("convolution forward matches reference, with and without bias") {
  backends b;
  core::rng g(1);
  for (const auto& cc : conv_cases) {
    INFO(cc.name);
    const core::conv2d_desc d{cc.stride_h, cc.stride_w, cc.pad_h, cc.pad_w};
    const auto p = core::window_out(cc.h, static_cast<int>(cc.r), d.stride_h, d.pad_h);
    const auto q = core::window_out(cc.w, static_cast<int>(cc.s), d.stride_w, d.pad_w);
    auto x = b.random({cc.n, cc.c, cc.h, cc.w}, g);
    auto w = b.random({cc.k, cc.c, cc.r, cc.s}, g);
    auto bias = b.random({cc.k}, g);
    for (bool with_bias : {true, false}) {
      auto y = b.filled({cc.n, cc.k, p, q}, std::numeric_limits<float>::quiet_NaN());
      b.ref.conv2d_forward(d, x.r, w.r, with_bias ? bias.r : tensor(), y.r);
      b.dnn.conv2d_forward(d, x.d, w.d, with_bias ? bias.d : tensor(), y.d);
      CHECK(rel_error(b, y) < tol);
    }
  }
}

TEST_CASE("convolution backward data matches reference and overwrites dx") {
  backends b;
  core::rng g(2);
  for (const auto& cc : conv_cases) {
    INFO(cc.name);
    const core::conv2d_desc d{cc.stride_h, cc.stride_w, cc.pad_h, cc.pad_w};
    const auto p = core::window_out(cc.h, static_cast<int>(cc.r), d.stride_h, d.pad_h);
    const auto q = core::window_out(cc.w, static_cast<int>(cc.s), d.stride_w, d.pad_w);
    auto dy = b.random({cc.n, cc.k, p, q}, g);
    auto w = b.random({cc.k, cc.c, cc.r, cc.s}, g);
    auto dx = b.filled({cc.n, cc.c, cc.h, cc.w}, std::numeric_limits<float>::quiet_NaN());
    b.ref.conv2d_backward_data(d, dy.r, w.r, dx.r);
    b.dnn.conv2d_backward_data(d, dy.d, w.d, dx.d);
    CHECK(rel_error(b, dx) < tol);
  }
}

TEST_CASE("convolution backward weights accumulates into dw and db like reference") {
  backends b;
  core::rng g(3);
  for (const auto& cc : conv_cases) {
    INFO(cc.name);
    const core::conv2d_desc d{cc.stride_h, cc.stride_w, cc.pad_h, cc.pad_w};
    const auto p = core::window_out(cc.h, static_cast<int>(cc.r), d.stride_h, d.pad_h);
    const auto q = core::window_out(cc.w, static_cast<int>(cc.s), d.stride_w, d.pad_w);
    auto x = b.random({cc.n, cc.c, cc.h, cc.w}, g);
    auto dy = b.random({cc.n, cc.k, p, q}, g);
    auto dw = b.random({cc.k, cc.c, cc.r, cc.s}, g, -10.0f, 10.0f);
    auto db = b.random({cc.k}, g, -10.0f, 10.0f);
    // Twice: the second call must add to the first one's result, not replace it.
    for (int i = 0; i < 2; ++i) {
      b.ref.conv2d_backward_weights(d, x.r, dy.r, dw.r, db.r);
      b.dnn.conv2d_backward_weights(d, x.d, dy.d, dw.d, db.d);
    }
    CHECK(rel_error(b, dw) < tol);
    CHECK(rel_error(b, db) < tol);
    auto dw2 = b.random({cc.k, cc.c, cc.r, cc.s}, g);
    b.ref.conv2d_backward_weights(d, x.r, dy.r, dw2.r, tensor());
    b.dnn.conv2d_backward_weights(d, x.d, dy.d, dw2.d, tensor());
    CHECK(rel_error(b, dw2) < tol);
  }
}

namespace {

struct pool_case {
  const char* name;
  std::int64_t n, c, h, w;
  core::pool2d_desc d;
};

const pool_case pool_cases[] = {
    {"lenet pool1 2x2", 64, 6, 28, 28, {core::pool_kind::max, 2, 2, 2, 2, 0, 0}},
    {"lenet pool2 2x2", 64, 16, 10, 10, {core::pool_kind::max, 2, 2, 2, 2, 0, 0}},
    {"resnet 3x3 stride 2 pad 1", 4, 16, 9, 9, {core::pool_kind::max, 3, 3, 2, 2, 1, 1}},
    {"odd 3x2 window stride 2x1 pad 1x0", 3, 5, 7, 6, {core::pool_kind::max, 3, 2, 2, 1, 1, 0}},
    {"odd size 2x2 (last column unused)", 2, 3, 5, 7, {core::pool_kind::max, 2, 2, 2, 2, 0, 0}},
    {"overlapping 3x3 stride 1", 2, 4, 6, 6, {core::pool_kind::max, 3, 3, 1, 1, 0, 0}},
};

}  // namespace

TEST_CASE("pooling forward and backward match reference for max and avg, in both implementations") {
  using cleave::backend::detail::pool_impl;
  for (auto impl : {pool_impl::automatic, pool_impl::primitive}) {
    backends b(cleave::backend::detail::onednn_options{.pooling = impl});
    core::rng g(4);
    for (const auto& pc : pool_cases) {
      for (auto kind : {core::pool_kind::max, core::pool_kind::avg}) {
        INFO(pc.name << (kind == core::pool_kind::max ? " max" : " avg")
                     << (impl == pool_impl::automatic ? " automatic" : " primitive"));
        auto d = pc.d;
        d.kind = kind;
        const auto p = core::window_out(pc.h, d.kernel_h, d.stride_h, d.pad_h);
        const auto q = core::window_out(pc.w, d.kernel_w, d.stride_w, d.pad_w);
        auto x = b.random({pc.n, pc.c, pc.h, pc.w}, g, -2.0f, 2.0f);
        auto y = b.filled({pc.n, pc.c, p, q}, std::numeric_limits<float>::quiet_NaN());
        tensor ws_r, ws_d;
        b.ref.pool2d_forward(d, x.r, y.r, &ws_r);
        b.dnn.pool2d_forward(d, x.d, y.d, &ws_d);
        CHECK(rel_error(b, y) < tol);
        auto dy = b.random({pc.n, pc.c, p, q}, g);
        auto dx = b.filled({pc.n, pc.c, pc.h, pc.w}, std::numeric_limits<float>::quiet_NaN());
        b.ref.pool2d_backward(d, x.r, dy.r, ws_r, dx.r);
        b.dnn.pool2d_backward(d, x.d, dy.d, ws_d, dx.d);
        CHECK(rel_error(b, dx) < tol);
        // Inference (no workspace) gives the same output.
        auto y2 = b.filled({pc.n, pc.c, p, q}, 0.0f);
        b.ref.pool2d_forward(d, x.r, y2.r, nullptr);
        b.dnn.pool2d_forward(d, x.d, y2.d, nullptr);
        CHECK(rel_error(b, y2) < tol);
      }
    }
  }
}

TEST_CASE("max pooling routes a tied window's gradient to its first element") {
  using cleave::backend::detail::pool_impl;
  for (auto impl : {pool_impl::automatic, pool_impl::primitive}) {
    INFO((impl == pool_impl::automatic ? "automatic" : "primitive"));
    backends b(cleave::backend::detail::onednn_options{.pooling = impl});
    // Values from {0, 1} make most 2x2 windows tied.
    core::rng g(5);
    std::vector<float> v(2 * 3 * 8 * 8);
    for (auto& e : v) e = static_cast<float>(g.below(2));
    auto x = b.from({2, 3, 8, 8}, v);
    const core::pool2d_desc d{core::pool_kind::max, 2, 2, 2, 2, 0, 0};
    auto y = b.filled({2, 3, 4, 4}, 0.0f);
    tensor ws_r, ws_d;
    b.ref.pool2d_forward(d, x.r, y.r, &ws_r);
    b.dnn.pool2d_forward(d, x.d, y.d, &ws_d);
    auto dy = b.random({2, 3, 4, 4}, g, 1.0f, 2.0f);
    auto dx = b.filled({2, 3, 8, 8}, 0.0f);
    b.ref.pool2d_backward(d, x.r, dy.r, ws_r, dx.r);
    b.dnn.pool2d_backward(d, x.d, dy.d, ws_d, dx.d);
    CHECK(values(b.ref, dx.r) == values(b.dnn, dx.d));
  }
}

TEST_CASE("linear forward and backward match reference, accumulating dw and db") {
  backends b;
  core::rng g(6);
  struct lc {
    std::int64_t n, in, out;
  };
  for (auto [n, in, out] : {lc{64, 400, 120}, lc{64, 120, 84}, lc{64, 84, 10}, lc{7, 13, 5}, lc{1, 3, 1}}) {
    INFO("n=" << n << " in=" << in << " out=" << out);
    auto x = b.random({n, in}, g);
    auto w = b.random({out, in}, g);
    auto bias = b.random({out}, g);
    for (bool with_bias : {true, false}) {
      auto y = b.filled({n, out}, std::numeric_limits<float>::quiet_NaN());
      b.ref.linear_forward(x.r, w.r, with_bias ? bias.r : tensor(), y.r);
      b.dnn.linear_forward(x.d, w.d, with_bias ? bias.d : tensor(), y.d);
      CHECK(rel_error(b, y) < tol);
    }
    auto dy = b.random({n, out}, g);
    auto dx = b.filled({n, in}, std::numeric_limits<float>::quiet_NaN());
    b.ref.linear_backward_data(dy.r, w.r, dx.r);
    b.dnn.linear_backward_data(dy.d, w.d, dx.d);
    CHECK(rel_error(b, dx) < tol);
    auto dw = b.random({out, in}, g, -5.0f, 5.0f);
    auto db = b.random({out}, g, -5.0f, 5.0f);
    for (int i = 0; i < 2; ++i) {
      b.ref.linear_backward_weights(x.r, dy.r, dw.r, db.r);
      b.dnn.linear_backward_weights(x.d, dy.d, dw.d, db.d);
    }
    CHECK(rel_error(b, dw) < tol);
    CHECK(rel_error(b, db) < tol);
  }
}

TEST_CASE("linear accepts a 4-D input flattened per item") {
  backends b;
  core::rng g(7);
  auto x = b.random({8, 16, 5, 5}, g);
  auto w = b.random({12, 400}, g);
  auto bias = b.random({12}, g);
  auto y = b.filled({8, 12}, 0.0f);
  b.ref.linear_forward(x.r, w.r, bias.r, y.r);
  b.dnn.linear_forward(x.d, w.d, bias.d, y.d);
  CHECK(rel_error(b, y) < tol);
  auto dy = b.random({8, 12}, g);
  auto dx = b.filled({8, 16, 5, 5}, 0.0f);
  b.ref.linear_backward_data(dy.r, w.r, dx.r);
  b.dnn.linear_backward_data(dy.d, w.d, dx.d);
  CHECK(rel_error(b, dx) < tol);
}

TEST_CASE("matmul matches reference for every transpose, alpha and beta") {
  backends b;
  core::rng g(8);
  const std::int64_t m = 13, k = 21, n = 9;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, {0.5f, 0.0f}, {1.0f, 1.0f}, {-2.0f, 0.25f}}) {
        INFO("trans_a=" << ta << " trans_b=" << tb << " alpha=" << alpha << " beta=" << beta);
        auto a = ta ? b.random({k, m}, g) : b.random({m, k}, g);
        auto bb = tb ? b.random({n, k}, g) : b.random({k, n}, g);
        // beta == 0: c is not read, so NaN there must not leak into the result.
        auto c = beta == 0.0f ? b.filled({m, n}, std::numeric_limits<float>::quiet_NaN()) : b.random({m, n}, g);
        b.ref.matmul(a.r, bb.r, c.r, ta, tb, alpha, beta);
        b.dnn.matmul(a.d, bb.d, c.d, ta, tb, alpha, beta);
        CHECK(rel_error(b, c) < tol);
      }
}

TEST_CASE("relu forward and backward match reference, also in place") {
  backends b;
  core::rng g(9);
  auto x = b.random({64, 6, 28, 28}, g);
  auto y = b.filled({64, 6, 28, 28}, 0.0f);
  b.ref.relu_forward(x.r, y.r);
  b.dnn.relu_forward(x.d, y.d);
  CHECK(values(b.ref, y.r) == values(b.dnn, y.d));
  auto dy = b.random({64, 6, 28, 28}, g);
  auto dx = b.filled({64, 6, 28, 28}, 0.0f);
  b.ref.relu_backward(y.r, dy.r, dx.r);
  b.dnn.relu_backward(y.d, dy.d, dx.d);
  CHECK(rel_error(b, dx) == 0.0);
  // dx aliasing dy and y aliasing x.
  b.ref.relu_backward(y.r, dy.r, dy.r);
  b.dnn.relu_backward(y.d, dy.d, dy.d);
  CHECK(rel_error(b, dy) == 0.0);
  b.ref.relu_forward(x.r, x.r);
  b.dnn.relu_forward(x.d, x.d);
  CHECK(values(b.ref, x.r) == values(b.dnn, x.d));
}

TEST_CASE("batch norm training matches reference, running variance unbiased") {
  backends b;
  core::rng g(10);
  for (const shape s : {shape{8, 16, 6, 6}, shape{5, 3, 7, 3}, shape{32, 10}}) {
    INFO(s.str());
    const std::int64_t c = s[1];
    const core::batchnorm_desc d{1e-5f, 0.1f};
    auto x = b.random(s, g, -3.0f, 5.0f);
    auto gamma = b.random({c}, g, 0.5f, 1.5f);
    auto beta = b.random({c}, g);
    auto y = b.filled(s, 0.0f);
    auto mean = b.filled({c}, 0.0f), invstd = b.filled({c}, 0.0f);
    auto rm = b.random({c}, g), rv = b.random({c}, g, 0.5f, 2.0f);
    b.ref.batchnorm_forward_train(d, x.r, gamma.r, beta.r, y.r, mean.r, invstd.r, rm.r, rv.r);
    b.dnn.batchnorm_forward_train(d, x.d, gamma.d, beta.d, y.d, mean.d, invstd.d, rm.d, rv.d);
    CHECK(rel_error(b, y) < tol);
    CHECK(rel_error(b, mean) < tol);
    CHECK(rel_error(b, invstd) < tol);
    CHECK(rel_error(b, rm) < tol);
    CHECK(rel_error(b, rv) < tol);

    auto yi = b.filled(s, 0.0f);
    b.ref.batchnorm_forward_infer(d, x.r, gamma.r, beta.r, rm.r, rv.r, yi.r);
    b.dnn.batchnorm_forward_infer(d, x.d, gamma.d, beta.d, rm.d, rv.d, yi.d);
    CHECK(rel_error(b, yi) < tol);

    auto dy = b.random(s, g);
    auto dx = b.filled(s, 0.0f);
    auto dgamma = b.random({c}, g), dbeta = b.random({c}, g);
    for (int i = 0; i < 2; ++i) {
      b.ref.batchnorm_backward(d, x.r, dy.r, gamma.r, mean.r, invstd.r, dx.r, dgamma.r, dbeta.r);
      b.dnn.batchnorm_backward(d, x.d, dy.d, gamma.d, mean.d, invstd.d, dx.d, dgamma.d, dbeta.d);
    }
    CHECK(rel_error(b, dx) < 1e-4);
    CHECK(rel_error(b, dgamma) < tol);
    CHECK(rel_error(b, dbeta) < tol);
  }
}

TEST_CASE("a repeated op reuses its cached primitive") {
  backends b;
  core::rng g(11);
  auto x = b.random({4, 3, 8, 8}, g);
  auto w = b.random({5, 3, 3, 3}, g);
  auto y = b.filled({4, 5, 8, 8}, 0.0f);
  const core::conv2d_desc d{1, 1, 1, 1};
  b.dnn.conv2d_forward(d, x.d, w.d, tensor(), y.d);
  const auto n = b.dnn.n_cached();
  for (int i = 0; i < 3; ++i) b.dnn.conv2d_forward(d, x.d, w.d, tensor(), y.d);
  CHECK(b.dnn.n_cached() == n);
  auto y2 = b.filled({4, 5, 8, 8}, 0.0f);  // other memory, same shape
  b.dnn.conv2d_forward(d, x.d, w.d, tensor(), y2.d);
  CHECK(b.dnn.n_cached() == n);
  CHECK(values(b.dnn, y.d) == values(b.dnn, y2.d));
}

namespace {

// Whether this CPU runs oneDNN's AVX-512 core kernels (Winograd and the few-channel loops need them).
bool avx512_core() {
  const auto isa = dnnl::get_effective_cpu_isa();
  return isa >= dnnl::cpu_isa::avx512_core && isa != dnnl::cpu_isa::avx512_mic && isa != dnnl::cpu_isa::avx512_mic_4ops;
}

constexpr cleave::backend::detail::conv_algorithm both_algorithms[] = {
    cleave::backend::detail::conv_algorithm::automatic, cleave::backend::detail::conv_algorithm::direct};

}  // namespace

TEST_CASE("3x3 stride-1 convolutions in 16s of channels run winograd where the CPU has it, direct when told") {
  const bool avx512 = avx512_core();
  for (auto algo : both_algorithms) {
    const bool automatic = algo == cleave::backend::detail::conv_algorithm::automatic;
    INFO("conv_algorithm " << (automatic ? "automatic" : "direct"));
    backends b(cleave::backend::detail::onednn_options{.conv = algo});
    core::rng g(5);
    const core::conv2d_desc d{1, 1, 1, 1};
    auto x = b.random({2, 32, 8, 8}, g);
    auto w = b.random({16, 32, 3, 3}, g);
    auto y = b.filled({2, 16, 8, 8}, 0.0f);
    b.dnn.conv2d_forward(d, x.d, w.d, tensor(), y.d);
    auto dx = b.filled({2, 32, 8, 8}, 0.0f);
    b.dnn.conv2d_backward_data(d, y.d, w.d, dx.d);
    auto dw = b.filled({16, 32, 3, 3}, 0.0f);
    b.dnn.conv2d_backward_weights(d, x.d, y.d, dw.d, tensor());
    CHECK(b.dnn.n_cached_running("wino") == (automatic && avx512 ? 3 : 0));
    // Neither stride 2 nor a channel count off the 16s.
    auto y2 = b.filled({2, 16, 4, 4}, 0.0f);
    b.dnn.conv2d_forward({2, 2, 1, 1}, x.d, w.d, tensor(), y2.d);
    auto x3 = b.random({2, 24, 8, 8}, g);
    auto w3 = b.random({16, 24, 3, 3}, g);
    b.dnn.conv2d_forward(d, x3.d, w3.d, tensor(), y.d);
    CHECK(b.dnn.n_cached_running("wino") == (automatic && avx512 ? 3 : 0));
  }
}

TEST_CASE("few-channel convolutions run the backend's own loops on AVX-512, oneDNN when told") {
  const bool avx512 = avx512_core();
  for (auto algo : both_algorithms) {
    const bool automatic = algo == cleave::backend::detail::conv_algorithm::automatic;
    INFO("conv_algorithm " << (automatic ? "automatic" : "direct"));
    backends b(cleave::backend::detail::onednn_options{.conv = algo});
    core::rng g(6);
    // LeNet-5's first layer (1 -> 6, 5x5, pad 2): forward and backward weights on the loops;
    // its second (6 -> 16): forward on oneDNN, backward data on the loops.
    const core::conv2d_desc d1{1, 1, 2, 2}, d2{1, 1, 0, 0};
    auto x = b.random({4, 1, 28, 28}, g);
    auto w1 = b.random({6, 1, 5, 5}, g), bias1 = b.random({6}, g);
    auto y1 = b.filled({4, 6, 28, 28}, 0.0f);
    b.dnn.conv2d_forward(d1, x.d, w1.d, bias1.d, y1.d);
    b.ref.conv2d_forward(d1, x.r, w1.r, bias1.r, y1.r);
    CHECK(rel_error(b, y1) < tol);
    auto dw1 = b.filled({6, 1, 5, 5}, 0.5f), db1 = b.filled({6}, 0.5f);
    b.dnn.conv2d_backward_weights(d1, x.d, y1.d, dw1.d, db1.d);
    b.ref.conv2d_backward_weights(d1, x.r, y1.r, dw1.r, db1.r);
    CHECK(rel_error(b, dw1) < tol);
    CHECK(rel_error(b, db1) < tol);
    CHECK(b.dnn.n_narrow_calls() == (automatic && avx512 ? 2 : 0));
    auto p = b.random({4, 6, 14, 14}, g);
    auto w2 = b.random({16, 6, 5, 5}, g);
    auto y2 = b.filled({4, 16, 10, 10}, 0.0f);
    b.dnn.conv2d_forward(d2, p.d, w2.d, tensor(), y2.d);
    b.ref.conv2d_forward(d2, p.r, w2.r, tensor(), y2.r);
    auto dp = b.filled({4, 6, 14, 14}, 0.0f);
    b.dnn.conv2d_backward_data(d2, y2.d, w2.d, dp.d);
    b.ref.conv2d_backward_data(d2, y2.r, w2.r, dp.r);
    CHECK(rel_error(b, dp) < tol);
    CHECK(b.dnn.n_narrow_calls() == (automatic && avx512 ? 3 : 0));
    // Repeats bit for bit (per-thread partials added in thread order).
    auto dw_again = b.filled({6, 1, 5, 5}, 0.5f), db_again = b.filled({6}, 0.5f);
    b.dnn.conv2d_backward_weights(d1, x.d, y1.d, dw_again.d, db_again.d);
    CHECK(values(b.dnn, dw_again.d) == values(b.dnn, dw1.d));
    CHECK(values(b.dnn, db_again.d) == values(b.dnn, db1.d));
  }
}

TEST_CASE("ops on empty tensors do nothing and do not throw") {
  backends b;
  auto x = b.filled({0, 3, 8, 8}, 0.0f);
  auto w = b.filled({5, 3, 3, 3}, 1.0f);
  auto y = b.filled({0, 5, 8, 8}, 0.0f);
  CHECK_NOTHROW(b.dnn.conv2d_forward({1, 1, 1, 1}, x.d, w.d, tensor(), y.d));
  auto dw = b.filled({5, 3, 3, 3}, 2.0f);
  CHECK_NOTHROW(b.dnn.conv2d_backward_weights({1, 1, 1, 1}, x.d, y.d, dw.d, tensor()));
  CHECK(values(b.dnn, dw.d) == std::vector<float>(135, 2.0f));
  auto e = b.filled({0}, 0.0f);
  CHECK_NOTHROW(b.dnn.relu_forward(e.d, e.d));
}

TEST_CASE("the registry builds onednn by name and with a thread count") {
  bool listed = false;
  for (const auto& info : cleave::backend::list_backends())
    if (info.name == "onednn") {
      listed = true;
      CHECK(info.available);
      CHECK(info.detail.find("oneDNN") != std::string::npos);
    }
  CHECK(listed);
  auto be = cleave::backend::make_backend("onednn");
  CHECK(be->name() == "onednn");
  CHECK(be->host_memory());
  auto one = cleave::backend::make_backend("onednn:1");
  CHECK(one->device_name().find("1 thread)") != std::string::npos);
  // portable: the kernels a CPU without AVX-512 has (an emulated board runs them).
  for (const char* spec : {"onednn:1,portable", "onednn:portable"}) {
    INFO(spec);
    auto portable = cleave::backend::make_backend(spec);
    CHECK(portable->device_name().find("portable kernels") != std::string::npos);
    auto* dnn = dynamic_cast<cleave::backend::detail::onednn_backend*>(portable.get());
    REQUIRE(dnn != nullptr);
    auto x = dnn->zeros({2, 1, 28, 28}), w = dnn->zeros({6, 1, 5, 5}), y = dnn->zeros({2, 6, 28, 28});
    dnn->conv2d_forward({1, 1, 2, 2}, x, w, tensor(), y);
    auto x2 = dnn->zeros({2, 16, 8, 8}), w2 = dnn->zeros({16, 16, 3, 3}), y2 = dnn->zeros({2, 16, 8, 8});
    dnn->conv2d_forward({1, 1, 1, 1}, x2, w2, tensor(), y2);
    CHECK(dnn->n_narrow_calls() == 0);
    CHECK(dnn->n_cached_running("wino") == 0);
  }
}

TEST_CASE("the registry rejects a malformed onednn device with a clear message") {
  const auto refusal = [](const char* spec) {
    return cleave::testing::error_of([spec] { (void)cleave::backend::make_backend(spec); });
  };
  for (const char* spec : {"onednn:gpu", "onednn:0", "onednn:2x"}) {
    INFO(spec);
    CHECK(refusal(spec).find("optional thread count") != std::string::npos);
  }
  for (const char* spec : {"onednn:2,fast", "onednn:0,portable", "onednn:,portable,x"}) {
    INFO(spec);
    CHECK_THROWS_AS((void)cleave::backend::make_backend(spec), core::error);
  }
  // A flag it does not know, or an empty one, is named with the flags it takes.
  for (const char* spec : {"onednn:2,fast", "onednn:2,portable,rowmajor", "onednn:2,"}) {
    INFO(spec);
    CHECK(refusal(spec).find("the flags 'portable' and 'row-major'") != std::string::npos);
  }
  // Both flags, in either order, with or without a thread count.
  for (const char* spec :
       {"onednn:row-major", "onednn:2,row-major", "onednn:2,portable,row-major", "onednn:row-major,portable"}) {
    INFO(spec);
    CHECK(cleave::backend::make_backend(spec)->name() == "onednn");
  }
}

TEST_CASE("a oneDNN failure surfaces as core::error naming the call") {
  // A primitive descriptor oneDNN cannot create: matmul with mismatched inner dimensions.
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  const dnnl::memory::desc a({2, 3}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
  const dnnl::memory::desc bm({4, 5}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
  const dnnl::memory::desc c({2, 5}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
  try {
    (void)CLEAVE_CHECK_DNNL(dnnl::matmul::primitive_desc({a, bm, c}, eng));
    FAIL("no error");
  } catch (const core::error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("oneDNN call failed") != std::string::npos);
    CHECK(msg.find("matmul::primitive_desc") != std::string::npos);
  }
}

TEST_CASE("SGD and AdamW updates match reference on buffers large enough to be split over threads") {
  backends b;
  core::rng g(13);
  const std::int64_t n = 100003;
  auto p1 = b.random({n}, g), p2 = b.random({n}, g), p3 = b.random({n}, g), p4 = b.random({n}, g);
  auto buf1 = b.filled({n}, 0.0f), buf2 = b.filled({n}, 0.0f), m = b.filled({n}, 0.0f), v = b.filled({n}, 0.0f);
  for (int step = 1; step <= 3; ++step) {
    auto gr = b.random({n}, g);
    b.ref.sgd_update({0.1f, 0.9f, 5e-4f, false}, p1.r, gr.r, buf1.r);
    b.dnn.sgd_update({0.1f, 0.9f, 5e-4f, false}, p1.d, gr.d, buf1.d);
    b.ref.sgd_update({0.1f, 0.9f, 0.0f, true}, p2.r, gr.r, buf2.r);
    b.dnn.sgd_update({0.1f, 0.9f, 0.0f, true}, p2.d, gr.d, buf2.d);
    b.ref.sgd_update({0.05f, 0.0f, 0.01f, false}, p3.r, gr.r, tensor());
    b.dnn.sgd_update({0.05f, 0.0f, 0.01f, false}, p3.d, gr.d, tensor());
    b.ref.adamw_update({1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, step}, p4.r, gr.r, m.r, v.r);
    b.dnn.adamw_update({1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, step}, p4.d, gr.d, m.d, v.d);
  }
  for (const twin* t : {&p1, &buf1, &p2, &buf2, &p3, &p4, &m, &v}) CHECK(rel_error(b, *t) < 1e-6);
}

TEST_CASE("an evaluation gives back the blocks the training steps kept, and its own after it") {
  using namespace cleave::backend::detail;
  auto be = cleave::backend::make_backend("onednn");
  const auto m = core::resolve_model("lenet5", core::shape{1, 28, 28}, 10);
  core::train_config tc;
  tc.eval_batch = 100;
  core::trainer t(*be, m, tc);
  // A training step's blocks stay cached for the next step.
  std::vector<float> data(64 * 784);
  core::rng g(3);
  for (auto& v : data) v = g.uniform(0.0f, 1.0f);
  std::vector<std::int32_t> labels(64);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 10);
  float loss = 0;
  be->download(t.step(data.data(), labels.data(), 64), &loss);
  CHECK(host_cache_bytes() > 0);
  core::dataset d;
  d.item = core::shape{1, 28, 28};
  d.n_classes = 10;
  d.pixels.assign(static_cast<std::size_t>(300 * 784), 0);
  d.y.assign(300, 0);
  d.table.assign(256, 0.5f);
  const auto r = t.evaluate(d);
  CHECK(r.n == 300);
  CHECK(host_cache_bytes() == 0);
  // The next step allocates afresh and trains as before.
  be->download(t.step(data.data(), labels.data(), 64), &loss);
  CHECK(std::isfinite(loss));
}
