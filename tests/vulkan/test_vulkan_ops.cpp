// Every op of the vulkan backend against the reference backend, on small and odd shapes
// (lavapipe runs these at well under a GFLOP/s), including views at offsets and aliasing.
#include <doctest/doctest.h>

#include <bit>
#include <limits>

#include "cleave/core/convert.h"
#include "vk_test_util.h"

namespace cleave::test {

TEST_CASE("element-wise ops match the reference bit for bit, in place too") {
  pair_env e;
  no_validation_messages guard;
  for (std::int64_t n : {1, 7, 256, 1000, 70001}) {
    CAPTURE(n);
    auto a = e.rand({n}), b = e.rand({n}), y = e.rand({n});
    e.vk->add(a.vk, b.vk, y.vk);
    e.ref->add(a.ref, b.ref, y.ref);
    e.expect_equal(y, "add");
    e.vk->mul(a.vk, y.vk, y.vk);  // y aliases b operand
    e.ref->mul(a.ref, y.ref, y.ref);
    e.expect_equal(y, "mul in place");
    e.vk->axpy(0.37f, a.vk, y.vk);
    e.ref->axpy(0.37f, a.ref, y.ref);
    e.expect_equal(y, "axpy");
    e.vk->scale(y.vk, -1.5f);
    e.ref->scale(y.ref, -1.5f);
    e.expect_equal(y, "scale");
    e.vk->fill(a.vk, 2.5f);
    e.ref->fill(a.ref, 2.5f);
    e.expect_equal(a, "fill");
    e.vk->copy(y.vk, b.vk);
    e.ref->copy(y.ref, b.ref);
    e.expect_equal(b, "copy");
  }
}

TEST_CASE("copy between overlapping views of one buffer behaves like memmove") {
  pair_env e;
  no_validation_messages guard;
  auto buf = e.rand({100});
  e.vk->copy(buf.vk.view(0, {60}, core::dtype::f32), buf.vk.view(40 * 4, {60}, core::dtype::f32));
  e.ref->copy(buf.ref.view(0, {60}, core::dtype::f32), buf.ref.view(40 * 4, {60}, core::dtype::f32));
  e.expect_equal(buf, "overlapping copy");
}

TEST_CASE("relu forward and backward match the reference bit for bit") {
  pair_env e;
  no_validation_messages guard;
  auto x = e.rand({3, 5, 7, 11}), y = e.rand({3, 5, 7, 11}), dy = e.rand({3, 5, 7, 11}), dx = e.rand({3, 5, 7, 11});
  e.vk->relu_forward(x.vk, y.vk);
  e.ref->relu_forward(x.ref, y.ref);
  e.expect_equal(y, "relu_forward");
  e.vk->relu_backward(y.vk, dy.vk, dx.vk);
  e.ref->relu_backward(y.ref, dy.ref, dx.ref);
  e.expect_equal(dx, "relu_backward");
  e.vk->relu_backward(y.vk, dy.vk, dy.vk);  // dx aliases dy
  e.ref->relu_backward(y.ref, dy.ref, dy.ref);
  e.expect_equal(dy, "relu_backward in place");
  e.vk->relu_forward(x.vk, x.vk);
  e.ref->relu_forward(x.ref, x.ref);
  e.expect_equal(x, "relu_forward in place");
}

TEST_CASE("dropout reproduces core::dropout_keep bit for bit") {
  pair_env e;
  no_validation_messages guard;
  for (float p : {0.0f, 0.1f, 0.5f, 0.9f}) {
    for (std::uint32_t seed : {0u, 42u, 0xdeadbeefu}) {
      CAPTURE(p);
      CAPTURE(seed);
      const std::int64_t n = 5003;
      auto x = e.rand({n}), y = e.rand({n}), m = e.rand({n});
      e.vk->dropout_forward(x.vk, y.vk, m.vk, p, seed);
      e.ref->dropout_forward(x.ref, y.ref, m.ref, p, seed);
      e.expect_equal(m, "dropout mask");
      e.expect_equal(y, "dropout output");
      // And against the definition itself.
      const auto mask = fetch<float>(*e.vk, m.vk);
      const std::uint32_t thr = core::dropout_threshold(p);
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < n; ++i)
        wrong +=
            (mask[static_cast<std::size_t>(i)] != 0.0f) != core::dropout_keep(seed, static_cast<std::uint32_t>(i), thr);
      CHECK(wrong == 0);
    }
  }
}

namespace {

// Values that exercise every rounding and saturation rule of the casts.
std::vector<float> cast_probe_values() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          0.5f,
                          1.5f,
                          2.5f,
                          -0.5f,
                          -1.5f,
                          -2.5f,
                          127.5f,
                          128.0f,
                          -128.5f,
                          -129.0f,
                          255.5f,
                          256.0f,
                          254.5f,
                          1e10f,
                          -1e10f,
                          2147483520.0f,
                          2147483648.0f,
                          -2147483648.0f,
                          -2147483904.0f,
                          65504.0f,
                          65520.0f,
                          65519.99f,
                          6.1e-5f,
                          5.96e-8f,
                          2.98e-8f,
                          2.99e-8f,
                          1e-45f,
                          1.17549435e-38f,
                          3.0e-39f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::bit_cast<float>(0xffc12345u),
                          1.00048828125f,
                          1.000732421875f,
                          1.0009765625f,
                          3.14159265f,
                          -2.71828f,
                          1.00390625f,
                          1.01171875f,
                          33.3f,
                          -77.7f,
                          0.1f};
  core::rng r(7);
  for (int i = 0; i < 300; ++i) v.push_back(static_cast<float>(r.normal() * 300.0));
  for (int i = 0; i < 200; ++i) v.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(r.next_u64())));
  return v;
}

}  // namespace

TEST_CASE("cast between every pair of dtypes matches the reference bit for bit") {
  pair_env e;
  no_validation_messages guard;
  const auto values = cast_probe_values();
  const auto n = static_cast<std::int64_t>(values.size());
  const core::dtype all[] = {core::dtype::f32, core::dtype::f16, core::dtype::bf16,
                             core::dtype::i8,  core::dtype::u8,  core::dtype::i32};
  auto src32 = e.make({n}, values);
  for (auto from : all) {
    // Source of type `from` made by casting on the reference and uploading the same bytes.
    twin src{e.vk->empty({n}, from), e.ref->empty({n}, from)};
    e.ref->cast(src32.ref, src.ref);
    const auto bytes = fetch<std::uint8_t>(*e.ref, src.ref);
    e.vk->upload(src.vk, bytes.data());
    for (auto to : all) {
      CAPTURE(core::dtype_name(from));
      CAPTURE(core::dtype_name(to));
      // Destination is a view at an odd element offset of a larger buffer, so packed word
      // edges are exercised; the bytes around it must survive.
      const std::int64_t pad = 3;
      const std::size_t esz = core::dtype_size(to);
      twin whole{e.vk->empty({n + 2 * pad}, to), e.ref->empty({n + 2 * pad}, to)};
      std::vector<std::uint8_t> fill_bytes(whole.vk.bytes());
      for (std::size_t i = 0; i < fill_bytes.size(); ++i) fill_bytes[i] = static_cast<std::uint8_t>(0xa5 ^ i);
      e.vk->upload(whole.vk, fill_bytes.data());
      e.ref->upload(whole.ref, fill_bytes.data());
      twin dst{whole.vk.view(pad * esz, {n}, to), whole.ref.view(pad * esz, {n}, to)};
      e.vk->cast(src.vk, dst.vk);
      e.ref->cast(src.ref, dst.ref);
      e.expect_equal(whole, "cast");
    }
  }
}

TEST_CASE("cast reads sources at odd byte offsets") {
  pair_env e;
  no_validation_messages guard;
  std::vector<std::uint8_t> raw(41);
  for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<std::uint8_t>(i * 37 + 11);
  twin whole{e.vk->empty({41}, core::dtype::u8), e.ref->empty({41}, core::dtype::u8)};
  e.vk->upload(whole.vk, raw.data());
  e.ref->upload(whole.ref, raw.data());
  for (core::dtype src_t : {core::dtype::u8, core::dtype::i8}) {
    const twin src{whole.vk.view(1, {37}, src_t), whole.ref.view(1, {37}, src_t)};
    for (core::dtype to : {core::dtype::f32, core::dtype::f16, core::dtype::i32, core::dtype::bf16}) {
      twin dst{e.vk->empty({37}, to), e.ref->empty({37}, to)};
      e.vk->cast(src.vk, dst.vk);
      e.ref->cast(src.ref, dst.ref);
      e.expect_equal(dst, "cast from an odd offset");
    }
  }
}

TEST_CASE("matmul matches the reference for every transpose and odd shapes") {
  pair_env e;
  no_validation_messages guard;
  struct mnk {
    std::int64_t m, n, k;
  };
  for (const auto s : {mnk{1, 1, 1}, mnk{3, 5, 7}, mnk{17, 33, 65}, mnk{70, 3, 300}, mnk{2, 130, 19}, mnk{129, 67, 40},
                       mnk{300, 260, 33}}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      CAPTURE(s.m);
      CAPTURE(s.n);
      CAPTURE(s.k);
      CAPTURE(ta);
      CAPTURE(tb);
      auto a = ta ? e.rand({s.k, s.m}) : e.rand({s.m, s.k});
      auto b = tb ? e.rand({s.n, s.k}) : e.rand({s.k, s.n});
      // beta == 0 must not read c: start from NaN.
      auto c = e.filled({s.m, s.n}, std::numeric_limits<float>::quiet_NaN());
      e.vk->matmul(a.vk, b.vk, c.vk, ta, tb, 1.0f, 0.0f);
      e.ref->matmul(a.ref, b.ref, c.ref, ta, tb, 1.0f, 0.0f);
      e.expect_close(c, 1e-5f, 1e-5f * static_cast<float>(s.k), "matmul beta 0");
      e.vk->matmul(a.vk, b.vk, c.vk, ta, tb, -0.5f, 0.75f);
      e.ref->matmul(a.ref, b.ref, c.ref, ta, tb, -0.5f, 0.75f);
      e.expect_close(c, 1e-5f, 1e-5f * static_cast<float>(s.k), "matmul alpha beta");
    }
  }
}

TEST_CASE("matmul with a long reduction splits it and stays accurate") {
  pair_env e;
  no_validation_messages guard;
  auto a = e.rand({5, 6000}), b = e.rand({6000, 9}), c = e.rand({5, 9});
  e.vk->matmul(a.vk, b.vk, c.vk, false, false, 2.0f, 1.0f);
  e.ref->matmul(a.ref, b.ref, c.ref, false, false, 2.0f, 1.0f);
  e.expect_close(c, 1e-5f, 2e-4f, "split-K matmul");
}

TEST_CASE("linear forward and both backward passes match the reference") {
  pair_env e;
  no_validation_messages guard;
  struct dims {
    std::int64_t n, in, out;
  };
  for (const auto d : {dims{1, 1, 1}, dims{4, 7, 3}, dims{33, 120, 84}, dims{64, 84, 10}, dims{3, 400, 129}}) {
    CAPTURE(d.n);
    CAPTURE(d.in);
    CAPTURE(d.out);
    for (bool with_bias : {true, false}) {
      auto x = e.rand({d.n, d.in}), w = e.rand({d.out, d.in}), b = e.rand({d.out}), y = e.rand({d.n, d.out});
      const tensor bv = with_bias ? b.vk : tensor{}, br = with_bias ? b.ref : tensor{};
      e.vk->linear_forward(x.vk, w.vk, bv, y.vk);
      e.ref->linear_forward(x.ref, w.ref, br, y.ref);
      e.expect_close(y, 1e-5f, 1e-5f * static_cast<float>(d.in), "linear_forward");
      auto dy = e.rand({d.n, d.out}), dx = e.rand({d.n, d.in});
      e.vk->linear_backward_data(dy.vk, w.vk, dx.vk);
      e.ref->linear_backward_data(dy.ref, w.ref, dx.ref);
      e.expect_close(dx, 1e-5f, 1e-5f * static_cast<float>(d.out), "linear_backward_data");
      // Gradients accumulate into what is there.
      auto dw = e.rand({d.out, d.in}), db = e.rand({d.out});
      e.vk->linear_backward_weights(x.vk, dy.vk, dw.vk, with_bias ? db.vk : tensor{});
      e.ref->linear_backward_weights(x.ref, dy.ref, dw.ref, with_bias ? db.ref : tensor{});
      e.expect_close(dw, 1e-5f, 1e-5f * static_cast<float>(d.n), "linear_backward_weights dw");
      e.expect_close(db, 1e-5f, 1e-5f * static_cast<float>(d.n), "linear_backward_weights db");
    }
  }
}

TEST_CASE("linear layers take image-shaped inputs") {
  pair_env e;
  no_validation_messages guard;
  auto x = e.rand({4, 3, 5, 5}), w = e.rand({10, 75}), b = e.rand({10}), y = e.rand({4, 10});
  e.vk->linear_forward(x.vk, w.vk, b.vk, y.vk);
  e.ref->linear_forward(x.ref, w.ref, b.ref, y.ref);
  e.expect_close(y, 1e-5f, 1e-3f, "linear_forward of (N,C,H,W)");
}

namespace {

struct conv_case {
  std::int64_t n, c, h, w, k, r, s;
  int sh, sw, ph, pw;
};

}  // namespace

TEST_CASE("conv2d forward, backward data and backward weights match the reference") {
  pair_env e;
  no_validation_messages guard;
  const conv_case cases[] = {
      {2, 1, 12, 12, 6, 5, 5, 1, 1, 0, 0},  // LeNet conv1 shape, smaller image
      {2, 6, 7, 7, 16, 5, 5, 1, 1, 2, 2},   // padded 5x5
      {3, 4, 9, 8, 5, 3, 3, 2, 2, 1, 1},    // stride 2, odd sizes
      {2, 8, 6, 6, 12, 1, 1, 1, 1, 0, 0},   // 1x1
      {1, 3, 11, 7, 4, 3, 2, 3, 2, 1, 0},   // non-square kernel and strides
      {2, 2, 5, 5, 3, 5, 5, 1, 1, 2, 2},    // kernel as large as the image
      {1, 16, 8, 8, 32, 3, 3, 1, 1, 1, 1},  // ResNet-like block
      {2, 1, 4, 4, 2, 2, 2, 3, 3, 1, 1},    // stride larger than the kernel
  };
  for (const auto& cc : cases) {
    CAPTURE(cc.c);
    CAPTURE(cc.h);
    CAPTURE(cc.k);
    CAPTURE(cc.r);
    CAPTURE(cc.sh);
    CAPTURE(cc.ph);
    const core::conv2d_desc d{cc.sh, cc.sw, cc.ph, cc.pw};
    const std::int64_t p = core::window_out(cc.h, static_cast<int>(cc.r), cc.sh, cc.ph);
    const std::int64_t q = core::window_out(cc.w, static_cast<int>(cc.s), cc.sw, cc.pw);
    const float red_fwd = static_cast<float>(cc.c * cc.r * cc.s);
    for (bool with_bias : {true, false}) {
      auto x = e.rand({cc.n, cc.c, cc.h, cc.w}), w = e.rand({cc.k, cc.c, cc.r, cc.s}), b = e.rand({cc.k});
      auto y = e.filled({cc.n, cc.k, p, q}, std::numeric_limits<float>::quiet_NaN());
      e.vk->conv2d_forward(d, x.vk, w.vk, with_bias ? b.vk : tensor{}, y.vk);
      e.ref->conv2d_forward(d, x.ref, w.ref, with_bias ? b.ref : tensor{}, y.ref);
      e.expect_close(y, 1e-5f, 1e-5f * red_fwd, "conv2d_forward");

      auto dy = e.rand({cc.n, cc.k, p, q});
      auto dx = e.filled({cc.n, cc.c, cc.h, cc.w}, std::numeric_limits<float>::quiet_NaN());
      e.vk->conv2d_backward_data(d, dy.vk, w.vk, dx.vk);
      e.ref->conv2d_backward_data(d, dy.ref, w.ref, dx.ref);
      e.expect_close(dx, 1e-5f, 1e-5f * static_cast<float>(cc.k * cc.r * cc.s), "conv2d_backward_data");

      auto dw = e.rand({cc.k, cc.c, cc.r, cc.s}), db = e.rand({cc.k});
      e.vk->conv2d_backward_weights(d, x.vk, dy.vk, dw.vk, with_bias ? db.vk : tensor{});
      e.ref->conv2d_backward_weights(d, x.ref, dy.ref, dw.ref, with_bias ? db.ref : tensor{});
      const float red_w = static_cast<float>(cc.n * p * q);
      e.expect_close(dw, 1e-5f, 1e-5f * red_w, "conv2d_backward_weights dw");
      e.expect_close(db, 1e-5f, 1e-5f * red_w, "conv2d_backward_weights db");
    }
  }
}

TEST_CASE("conv2d backward weights over a long reduction splits it and stays accurate") {
  pair_env e;
  no_validation_messages guard;
  const core::conv2d_desc d{1, 1, 0, 0};
  auto x = e.rand({16, 1, 28, 28}), dy = e.rand({16, 6, 24, 24}), dw = e.rand({6, 1, 5, 5}), db = e.rand({6});
  e.vk->conv2d_backward_weights(d, x.vk, dy.vk, dw.vk, db.vk);
  e.ref->conv2d_backward_weights(d, x.ref, dy.ref, dw.ref, db.ref);
  e.expect_close(dw, 1e-5f, 1e-3f, "split-K conv2d_backward_weights dw");
  e.expect_close(db, 1e-5f, 1e-3f, "conv2d_backward_weights db");
}

TEST_CASE("max and average pooling forward and backward match the reference") {
  pair_env e;
  no_validation_messages guard;
  struct pool_case {
    int kh, kw, sh, sw, ph, pw;
  };
  for (const auto pc : {pool_case{2, 2, 2, 2, 0, 0}, pool_case{3, 3, 2, 2, 1, 1}, pool_case{3, 2, 1, 2, 1, 0},
                        pool_case{2, 2, 1, 1, 0, 0}, pool_case{1, 1, 2, 2, 0, 0}}) {
    for (auto kind : {core::pool_kind::max, core::pool_kind::avg}) {
      CAPTURE(pc.kh);
      CAPTURE(pc.sh);
      CAPTURE(pc.ph);
      CAPTURE(static_cast<int>(kind));
      core::pool2d_desc d;
      d.kind = kind;
      d.kernel_h = pc.kh;
      d.kernel_w = pc.kw;
      d.stride_h = pc.sh;
      d.stride_w = pc.sw;
      d.pad_h = pc.ph;
      d.pad_w = pc.pw;
      const std::int64_t h = 9, w = 8;
      const std::int64_t p = core::window_out(h, pc.kh, pc.sh, pc.ph), q = core::window_out(w, pc.kw, pc.sw, pc.pw);
      // Values on a coarse grid so that windows hold ties.
      auto vals = random_values(2 * 3 * h * w, e.seed++);
      for (auto& v : vals) v = std::round(v * 3.0f) / 3.0f;
      auto x = e.make({2, 3, h, w}, vals), y = e.rand({2, 3, p, q});
      tensor ws_vk, ws_ref;
      e.vk->pool2d_forward(d, x.vk, y.vk, &ws_vk);
      e.ref->pool2d_forward(d, x.ref, y.ref, &ws_ref);
      if (kind == core::pool_kind::max) {
        e.expect_equal(y, "max pool forward");
        REQUIRE(ws_vk.defined());
        CHECK(fetch<std::int32_t>(*e.vk, ws_vk) == fetch<std::int32_t>(*e.ref, ws_ref));
      } else {
        e.expect_close(y, 1e-6f, 1e-6f, "avg pool forward");
      }
      auto dy = e.rand({2, 3, p, q}), dx = e.rand({2, 3, h, w});
      e.vk->pool2d_backward(d, x.vk, dy.vk, ws_vk, dx.vk);
      e.ref->pool2d_backward(d, x.ref, dy.ref, ws_ref, dx.ref);
      e.expect_equal(dx, "pool backward");
    }
  }
}

TEST_CASE("inference pooling allocates no workspace") {
  pair_env e;
  core::pool2d_desc d;
  auto x = e.rand({1, 2, 4, 4}), y = e.rand({1, 2, 2, 2});
  e.vk->pool2d_forward(d, x.vk, y.vk, nullptr);
  e.ref->pool2d_forward(d, x.ref, y.ref, nullptr);
  e.expect_equal(y, "max pool without workspace");
}

TEST_CASE("batch norm training, inference and backward match the reference") {
  pair_env e;
  no_validation_messages guard;
  const core::shape shapes[] = {{4, 3, 5, 5}, {2, 16, 8, 8}, {1, 2, 1, 1}, {6, 5}, {64, 10}, {3, 4, 17, 19}};
  for (const auto& s : shapes) {
    CAPTURE(s.str());
    const std::int64_t c = s[1];
    core::batchnorm_desc d;
    d.eps = 1e-5f;
    d.momentum = 0.1f;
    auto x = e.rand(s, -2.0f, 3.0f), y = e.rand(s);
    auto gamma = e.rand({c}, 0.5f, 1.5f), beta = e.rand({c});
    auto sm = e.rand({c}), si = e.rand({c}), rm = e.rand({c}), rv = e.rand({c}, 0.5f, 2.0f);
    e.vk->batchnorm_forward_train(d, x.vk, gamma.vk, beta.vk, y.vk, sm.vk, si.vk, rm.vk, rv.vk);
    e.ref->batchnorm_forward_train(d, x.ref, gamma.ref, beta.ref, y.ref, sm.ref, si.ref, rm.ref, rv.ref);
    e.expect_close(y, 1e-4f, 1e-4f, "bn train y");
    e.expect_close(sm, 1e-5f, 1e-5f, "bn save_mean");
    e.expect_close(si, 1e-4f, 1e-5f, "bn save_invstd");
    e.expect_close(rm, 1e-5f, 1e-5f, "bn running_mean");
    e.expect_close(rv, 1e-5f, 1e-5f, "bn running_var (unbiased)");

    e.vk->batchnorm_forward_infer(d, x.vk, gamma.vk, beta.vk, rm.vk, rv.vk, y.vk);
    e.ref->batchnorm_forward_infer(d, x.ref, gamma.ref, beta.ref, rm.ref, rv.ref, y.ref);
    e.expect_close(y, 1e-5f, 1e-5f, "bn infer y");

    auto dy = e.rand(s), dx = e.rand(s), dg = e.rand({c}), db = e.rand({c});
    e.vk->batchnorm_backward(d, x.vk, dy.vk, gamma.vk, sm.vk, si.vk, dx.vk, dg.vk, db.vk);
    e.ref->batchnorm_backward(d, x.ref, dy.ref, gamma.ref, sm.ref, si.ref, dx.ref, dg.ref, db.ref);
    e.expect_close(dx, 1e-4f, 1e-4f, "bn backward dx");
    e.expect_close(dg, 1e-4f, 1e-4f, "bn backward dgamma");
    e.expect_close(db, 1e-4f, 1e-4f, "bn backward dbeta");
  }
}

TEST_CASE("softmax cross-entropy forward and backward match the reference") {
  pair_env e;
  no_validation_messages guard;
  for (const auto& [n, k] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {4, 10}, {64, 10}, {3, 1000}, {300, 7}}) {
    CAPTURE(n);
    CAPTURE(k);
    auto logits = e.rand({n, k}, -8.0f, 8.0f), probs = e.rand({n, k}), loss = e.rand({1});
    auto labels = e.labels(n, static_cast<std::int32_t>(k));
    e.vk->softmax_xent_forward(logits.vk, labels.vk, probs.vk, loss.vk);
    e.ref->softmax_xent_forward(logits.ref, labels.ref, probs.ref, loss.ref);
    e.expect_close(probs, 1e-5f, 1e-7f, "softmax probs");
    e.expect_close(loss, 1e-5f, 1e-6f, "cross-entropy loss");
    auto dl = e.rand({n, k});
    e.vk->softmax_xent_backward(probs.vk, labels.vk, dl.vk, 0.5f);
    e.ref->softmax_xent_backward(probs.ref, labels.ref, dl.ref, 0.5f);
    e.expect_close(dl, 1e-5f, 1e-7f, "softmax_xent_backward");
  }
}

TEST_CASE("softmax backward of identical probabilities matches the reference bit for bit") {
  pair_env e;
  auto probs = e.rand({16, 10}, 0.0f, 1.0f), dl = e.rand({16, 10});
  auto labels = e.labels(16, 10);
  e.vk->softmax_xent_backward(probs.vk, labels.vk, dl.vk, 1.0f);
  e.ref->softmax_xent_backward(probs.ref, labels.ref, dl.ref, 1.0f);
  e.expect_equal(dl, "softmax_xent_backward");
}

TEST_CASE("sgd updates match the reference bit for bit in every mode") {
  pair_env e;
  no_validation_messages guard;
  for (float momentum : {0.0f, 0.9f}) {
    for (bool nesterov : {false, true}) {
      for (float wd : {0.0f, 5e-4f}) {
        CAPTURE(momentum);
        CAPTURE(nesterov);
        CAPTURE(wd);
        core::sgd_desc d{0.05f, momentum, wd, nesterov};
        auto p = e.rand({1001}), g = e.rand({1001}), buf = e.rand({1001});
        for (int step = 0; step < 3; ++step) {
          e.vk->sgd_update(d, p.vk, g.vk, momentum != 0.0f ? buf.vk : tensor{});
          e.ref->sgd_update(d, p.ref, g.ref, momentum != 0.0f ? buf.ref : tensor{});
        }
        e.expect_equal(p, "sgd param");
        e.expect_equal(buf, "sgd momentum buffer");
      }
    }
  }
}

TEST_CASE("adamw updates match the reference") {
  pair_env e;
  no_validation_messages guard;
  auto p = e.rand({777}), g = e.rand({777}), m = e.filled({777}, 0.0f), v = e.filled({777}, 0.0f);
  for (std::int64_t step = 1; step <= 5; ++step) {
    core::adamw_desc d;
    d.lr = 1e-2f;
    d.step = step;
    e.vk->adamw_update(d, p.vk, g.vk, m.vk, v.vk);
    e.ref->adamw_update(d, p.ref, g.ref, m.ref, v.ref);
  }
  e.expect_close(p, 1e-6f, 1e-6f, "adamw param");
  e.expect_close(m, 1e-6f, 1e-7f, "adamw m");
  e.expect_close(v, 1e-6f, 1e-7f, "adamw v");
}

TEST_CASE("ops work on views at unaligned offsets inside one parameter buffer") {
  pair_env e;
  no_validation_messages guard;
  // One flat buffer holding w (5,7) at element 1 and b (5) at element 37, as a stage keeps
  // its parameters; 4-byte offsets below any storage-buffer alignment.
  auto flat = e.rand({64});
  const twin w{flat.vk.view(4, {5, 7}, core::dtype::f32), flat.ref.view(4, {5, 7}, core::dtype::f32)};
  const twin b{flat.vk.view(37 * 4, {5}, core::dtype::f32), flat.ref.view(37 * 4, {5}, core::dtype::f32)};
  auto x = e.rand({3, 7}), y = e.rand({3, 5});
  e.vk->linear_forward(x.vk, w.vk, b.vk, y.vk);
  e.ref->linear_forward(x.ref, w.ref, b.ref, y.ref);
  e.expect_close(y, 1e-5f, 1e-5f, "linear on views");
  auto dy = e.rand({3, 5});
  auto grads = e.filled({64}, 0.0f);
  const twin dw{grads.vk.view(4, {5, 7}, core::dtype::f32), grads.ref.view(4, {5, 7}, core::dtype::f32)};
  const twin db{grads.vk.view(37 * 4, {5}, core::dtype::f32), grads.ref.view(37 * 4, {5}, core::dtype::f32)};
  e.vk->linear_backward_weights(x.vk, dy.vk, dw.vk, db.vk);
  e.ref->linear_backward_weights(x.ref, dy.ref, dw.ref, db.ref);
  e.expect_close(grads, 1e-5f, 1e-5f, "gradients on views");
  core::sgd_desc sd{0.1f, 0.0f, 0.0f, false};
  e.vk->sgd_update(sd, flat.vk.view(4, {40}, core::dtype::f32), grads.vk.view(4, {40}, core::dtype::f32), {});
  e.ref->sgd_update(sd, flat.ref.view(4, {40}, core::dtype::f32), grads.ref.view(4, {40}, core::dtype::f32), {});
  e.expect_close(flat, 1e-6f, 1e-6f, "sgd on a view");
  auto half = e.rand({2, 3, 4, 4});
  auto tail = half.vk.slice_batch(1, 1);
  auto tail_ref = half.ref.slice_batch(1, 1);
  e.vk->relu_forward(tail, tail);
  e.ref->relu_forward(tail_ref, tail_ref);
  e.expect_equal(half, "relu on a batch slice");
}

}  // namespace cleave::test
