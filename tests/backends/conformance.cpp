// Conformance suite: every op of every available backend, forward and backward, against the
// reference backend on seeded random inputs. A new backend joins by registering itself.
#include <doctest/doctest.h>

#include <bit>
#include <cstring>
#include <limits>
#include <map>

#include "cleave/core/codec.h"

#include "../support/backend_harness.h"
#include "../support/residual_chain.h"

namespace {

using namespace cleave;
using cleave::testing::backends_under_test;
using cleave::testing::make;
using cleave::testing::random_vec;
using cleave::testing::read;
using core::shape;
using core::tensor;

// Backends are created once per process: device backends cache pipelines across cases.
core::backend& get(const std::string& name) {
  static std::map<std::string, std::unique_ptr<core::backend>> cache;
  auto& slot = cache[name];
  if (!slot) slot = backend::make_backend(name);
  return *slot;
}

using outs_t = std::vector<std::vector<float>>;
constexpr float k_rtol = 1e-3f, k_atol = 1e-4f;

// Runs `body(backend)` on the reference and on each backend under test, and compares the
// host vectors it returns, one by one.
template <class F>
void compare_with_reference(const char* what, F body, float rtol = k_rtol, float atol = k_atol) {
  const std::vector<std::vector<float>> want = body(get("reference"));
  for (const auto& name : backends_under_test()) {
    SUBCASE(name.c_str()) {
      const std::vector<std::vector<float>> got = body(get(name));
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < want.size(); ++i)
        CLEAVE_CHECK_CLOSE(got[i], want[i], rtol, atol, name << " " << what << " output " << i);
    }
  }
}

}  // namespace

TEST_CASE("fill, copy, add, mul, axpy and scale match the reference") {
  const shape s{3, 5, 7};
  const auto va = random_vec(s.numel(), 1), vb = random_vec(s.numel(), 2);
  compare_with_reference("element-wise", [&](core::backend& b) {
    tensor a = make(b, s, va), c = make(b, s, vb), y = b.empty(s), f = b.empty(s), cp = b.empty(s);
    b.fill(f, 0.25f);
    b.copy(a, cp);
    b.add(a, c, y);
    tensor m = b.empty(s);
    b.mul(a, c, m);
    b.mul(m, m, m);  // in place
    b.axpy(-0.5f, a, c);
    b.scale(a, 3.0f);
    return outs_t{read(b, f), read(b, cp), read(b, y), read(b, m), read(b, c), read(b, a)};
  });
}

TEST_CASE("cast between every pair of dtypes matches the reference bit for bit") {
  std::vector<float> special = {0.0f,
                                -0.0f,
                                1.0f,
                                -1.0f,
                                0.5f,
                                1.5f,
                                2.5f,
                                -2.5f,
                                3.5f,
                                127.5f,
                                128.0f,
                                -128.5f,
                                -129.0f,
                                254.5f,
                                255.5f,
                                300.0f,
                                -300.0f,
                                65504.0f,
                                65519.0f,
                                65520.0f,
                                1e-8f,
                                6e-8f,
                                3e-5f,
                                1.0009765625f,
                                1.00048828125f,
                                3.14159265f,
                                1e10f,
                                -1e10f,
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(),
                                2147483520.0f,
                                -2147483648.0f,
                                3e9f};
  auto rnd = random_vec(64, 7, -400.0f, 400.0f);
  special.insert(special.end(), rnd.begin(), rnd.end());
  const shape s{static_cast<std::int64_t>(special.size())};
  for (int from = 0; from < core::n_dtypes; ++from)
    for (int to = 0; to < core::n_dtypes; ++to) {
      const auto tf = static_cast<core::dtype>(from), tt = static_cast<core::dtype>(to);
      CAPTURE(core::dtype_name(tf));
      CAPTURE(core::dtype_name(tt));
      compare_with_reference(
          "cast",
          [&](core::backend& b) {
            // The source: f32 values cast to `from` on the reference, then moved in as raw bytes.
            auto& ref = get("reference");
            tensor src_ref = ref.empty(s, tf);
            ref.cast(make(ref, s, special), src_ref);
            std::vector<std::uint8_t> raw(src_ref.bytes());
            ref.download(src_ref, raw.data());
            tensor src = b.empty(s, tf), dst = b.empty(s, tt);
            b.upload(src, raw.data());
            b.cast(src, dst);
            std::vector<std::uint8_t> out(dst.bytes());
            b.download(dst, out.data());
            // Compare raw bytes exactly (as floats holding the byte values).
            return outs_t{std::vector<float>(out.begin(), out.end())};
          },
          0.0f, 0.0f);
    }
}

namespace {

// Every byte of t, as floats holding the byte values (an exact comparison, NaN bits included).
std::vector<float> bytes_of(core::backend& b, const tensor& t) {
  std::vector<std::uint8_t> raw(t.bytes());
  if (!raw.empty()) b.download(t, raw.data());
  return {raw.begin(), raw.end()};
}

}  // namespace

TEST_CASE("the int8 codec's channel maxima, codes and decoded values equal the reference bit for bit") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const shape s : {shape{3, 6, 7, 2}, shape{5, 6}, shape{37}, shape{2, 1, 300}}) {
    const std::int64_t n = s.numel(), inner = s.rank() > 2 ? s.numel_from(2) : 1;
    std::vector<float> vx = random_vec(n, 11, -3.0f, 3.0f);
    // Channel 1 all zero, channel 3 with a NaN, channel 4 with an infinity (where there are such
    // channels), and values on half steps of a scale to meet rounding ties.
    for (std::int64_t e = 0; e < n; ++e) {
      const std::int64_t c = s.rank() >= 2 ? (e / inner) % s[1] : 0;
      if (c == 1) vx[static_cast<std::size_t>(e)] = 0.0f;
      if (e % 5 == 0) vx[static_cast<std::size_t>(e)] = static_cast<float>(e % 11) * 0.25f - 1.25f;
    }
    // Channel 2 with max |x| 127: its scale is 1, and half steps are ties of the rounding.
    if (s.rank() >= 2 && s[1] > 2) {
      for (std::int64_t e = 0; e < n; ++e)
        if ((e / inner) % s[1] == 2) vx[static_cast<std::size_t>(e)] = static_cast<float>(e % 9) - 3.5f;
      vx[static_cast<std::size_t>(2 * inner)] = 127.0f;
    }
    if (s.rank() >= 2 && s[1] > 4) {
      vx[static_cast<std::size_t>(3 * inner)] = nan;
      vx[static_cast<std::size_t>(4 * inner + 1)] = -inf;
    }
    const std::int64_t channels = s.rank() >= 2 ? s[1] : 1;
    for (bool stochastic : {false, true}) {
      CAPTURE(s.str());
      CAPTURE(stochastic);
      compare_with_reference(
          "int8 codec",
          [&](core::backend& b) {
            tensor x = make(b, s, vx), amax = b.empty({channels});
            b.channel_absmax(x, amax);
            std::vector<float> am = read(b, amax), scales(am.size()), inv(am.size());
            core::int8_scales(am.data(), channels, scales.data(), inv.data());
            tensor inv_t = make(b, {channels}, inv), scales_t = make(b, {channels}, scales);
            // q one byte into a larger buffer whose other bytes must stay as they were.
            std::vector<std::int8_t> pattern(static_cast<std::size_t>(n + 6), 0x5a);
            tensor whole = b.empty({n + 6}, core::dtype::i8);
            b.upload(whole, pattern.data());
            tensor q = whole.view(1, s, core::dtype::i8);
            b.quantize_int8(x, inv_t, q, stochastic, 77u);
            tensor y = b.empty(s);
            b.dequantize_int8(q, scales_t, y);
            return outs_t{bytes_of(b, amax), bytes_of(b, whole), bytes_of(b, y)};
          },
          0.0f, 0.0f);
    }
  }
}

TEST_CASE("relu forward and backward match the reference") {
  const shape s{4, 3, 5, 5};
  const auto vx = random_vec(s.numel(), 3), vdy = random_vec(s.numel(), 4);
  compare_with_reference("relu", [&](core::backend& b) {
    tensor x = make(b, s, vx), y = b.empty(s), dy = make(b, s, vdy), dx = b.empty(s);
    b.relu_forward(x, y);
    b.relu_backward(y, dy, dx);
    tensor z = make(b, s, vx);
    b.relu_forward(z, z);  // in place
    return outs_t{read(b, y), read(b, dx), read(b, z)};
  });
}

TEST_CASE("clamp (ReLU6) forward and backward match the reference, bounds included") {
  const shape s{4, 3, 5, 5};
  auto vx = random_vec(s.numel(), 3, -9.0f, 9.0f);
  // Values on the bounds get no gradient, as PyTorch's hardtanh.
  vx[0] = 0.0f, vx[1] = 6.0f, vx[2] = -1.5f, vx[3] = 2.0f;
  const auto vdy = random_vec(s.numel(), 4);
  for (auto [lo, hi] : {std::pair{0.0f, 6.0f}, std::pair{-1.5f, 2.0f}}) {
    CAPTURE(lo);
    CAPTURE(hi);
    compare_with_reference(
        "clamp",
        [&, lo = lo, hi = hi](core::backend& b) {
          tensor x = make(b, s, vx), y = b.empty(s), dy = make(b, s, vdy), dx = b.empty(s);
          b.clamp_forward(x, y, lo, hi);
          b.clamp_backward(y, dy, dx, lo, hi);
          tensor z = make(b, s, vx), g = make(b, s, vdy);
          b.clamp_forward(z, z, lo, hi);      // in place
          b.clamp_backward(z, g, g, lo, hi);  // dx aliasing dy
          return outs_t{read(b, y), read(b, dx), read(b, z), read(b, g)};
        },
        0.0f, 0.0f);
  }
}

TEST_CASE("dropout draws the same mask on every backend") {
  const shape s{8, 333};
  const auto vx = random_vec(s.numel(), 5);
  for (float p : {0.0f, 0.1f, 0.5f, 0.9f})
    compare_with_reference(
        "dropout",
        [&](core::backend& b) {
          tensor x = make(b, s, vx), y = b.empty(s), mask = b.empty(s);
          b.dropout_forward(x, y, mask, p, 1234u);
          return outs_t{read(b, y), read(b, mask)};
        },
        1e-6f, 0.0f);
}

TEST_CASE("matmul matches the reference for every transpose and alpha, beta") {
  const std::int64_t m = 37, n = 29, k = 67;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      const shape sa = ta ? shape{k, m} : shape{m, k}, sb = tb ? shape{n, k} : shape{k, n};
      const auto va = random_vec(sa.numel(), 10), vb = random_vec(sb.numel(), 11), vc = random_vec(m * n, 12);
      compare_with_reference("matmul", [&](core::backend& b) {
        tensor a = make(b, sa, va), bb = make(b, sb, vb), c0 = b.empty({m, n}), c1 = make(b, {m, n}, vc);
        b.matmul(a, bb, c0, ta, tb, 1.0f, 0.0f);
        b.matmul(a, bb, c1, ta, tb, 0.5f, 2.0f);
        return outs_t{read(b, c0), read(b, c1)};
      });
    }
}

TEST_CASE("linear forward, backward-data and accumulating backward-weights match the reference") {
  for (auto [n, in, out, bias] : {std::tuple{64, 400, 120, true}, {3, 17, 5, false}, {1, 84, 10, true}}) {
    CAPTURE(n);
    CAPTURE(in);
    const auto vx = random_vec(n * in, 20), vw = random_vec(out * in, 21), vb = random_vec(out, 22),
               vdy = random_vec(n * out, 23), vdw = random_vec(out * in, 24), vdb = random_vec(out, 25);
    compare_with_reference("linear", [&, n = n, in = in, out = out, bias = bias](core::backend& b) {
      tensor x = make(b, {n, in}, vx), w = make(b, {out, in}, vw), bb = bias ? make(b, {out}, vb) : tensor{},
             y = b.empty({n, out}), dy = make(b, {n, out}, vdy), dx = b.empty({n, in}), dw = make(b, {out, in}, vdw),
             db = bias ? make(b, {out}, vdb) : tensor{};
      b.linear_forward(x, w, bb, y);
      b.linear_backward_data(dy, w, dx);
      b.linear_backward_weights(x, dy, dw, db);
      outs_t outs{read(b, y), read(b, dx), read(b, dw)};
      if (bias) outs.push_back(read(b, db));
      return outs;
    });
  }
}

namespace {
struct conv_case {
  std::int64_t n, c, h, w, k, r, s;
  int stride, pad;
  bool bias;
  int groups = 1;
};
}  // namespace

TEST_CASE("conv2d forward, backward-data and accumulating backward-weights match the reference") {
  const conv_case cases[] = {
      {2, 1, 28, 28, 6, 5, 5, 1, 2, true},    // LeNet conv1
      {2, 6, 14, 14, 16, 5, 5, 1, 0, true},   // LeNet conv2
      {2, 8, 9, 7, 12, 3, 3, 1, 1, false},    // ResNet 3x3, odd sizes
      {3, 5, 11, 10, 7, 3, 3, 2, 1, true},    // strided 3x3
      {2, 8, 8, 8, 16, 1, 1, 2, 0, false},    // 1x1 shortcut, stride 2
      {1, 3, 32, 32, 16, 3, 3, 1, 1, false},  // first layer on 32x32x3
      {2, 32, 10, 10, 48, 3, 3, 1, 1, true},  // 3x3 in 16s of channels: winograd on onednn (AVX-512)
      {2, 64, 4, 4, 64, 3, 3, 1, 1, false},   // ResNet-18's last stage on 28x28 inputs
      // Pointwise (1x1, stride 1): images over threads, one image split by columns, 49 columns.
      {4, 32, 28, 28, 64, 1, 1, 1, 0, true},
      {1, 64, 32, 32, 96, 1, 1, 1, 0, false},
      {2, 16, 7, 7, 24, 1, 1, 1, 0, true},
      // Grouped and depthwise (MobileNetV2's 3x3 depthwise, a channel multiplier, grouped 1x1).
      {2, 16, 9, 9, 16, 3, 3, 1, 1, false, 16},
      {2, 24, 9, 7, 24, 3, 3, 2, 1, false, 24},
      {3, 32, 8, 8, 32, 3, 3, 1, 1, true, 32},
      {16, 64, 28, 28, 64, 3, 3, 1, 1, true, 64},  // depthwise on both threads
      {2, 8, 11, 11, 8, 5, 5, 2, 2, true, 8},      // depthwise 5x5, stride 2
      {2, 8, 6, 6, 12, 3, 3, 1, 1, true, 4},
      {3, 4, 5, 5, 8, 3, 3, 1, 0, true, 4},
      {2, 6, 4, 4, 9, 1, 1, 1, 0, false, 3},
  };
  for (const auto& cc : cases) {
    CAPTURE(cc.c);
    CAPTURE(cc.h);
    CAPTURE(cc.r);
    CAPTURE(cc.stride);
    CAPTURE(cc.groups);
    const core::conv2d_desc d{cc.stride, cc.stride, cc.pad, cc.pad, cc.groups};
    const std::int64_t p = core::window_out(cc.h, static_cast<int>(cc.r), cc.stride, cc.pad);
    const std::int64_t q = core::window_out(cc.w, static_cast<int>(cc.s), cc.stride, cc.pad);
    const shape sx{cc.n, cc.c, cc.h, cc.w}, sw{cc.k, cc.c / cc.groups, cc.r, cc.s}, sy{cc.n, cc.k, p, q};
    const auto vx = random_vec(sx.numel(), 30), vw = random_vec(sw.numel(), 31), vb = random_vec(cc.k, 32),
               vdy = random_vec(sy.numel(), 33), vdw = random_vec(sw.numel(), 34), vdb = random_vec(cc.k, 35);
    compare_with_reference("conv2d", [&](core::backend& b) {
      tensor x = make(b, sx, vx), w = make(b, sw, vw), bb = cc.bias ? make(b, {cc.k}, vb) : tensor{}, y = b.empty(sy),
             dy = make(b, sy, vdy), dx = b.empty(sx), dw = make(b, sw, vdw),
             db = cc.bias ? make(b, {cc.k}, vdb) : tensor{};
      b.conv2d_forward(d, x, w, bb, y);
      b.conv2d_backward_data(d, dy, w, dx);
      b.conv2d_backward_weights(d, x, dy, dw, db);
      outs_t outs{read(b, y), read(b, dx), read(b, dw)};
      if (cc.bias) outs.push_back(read(b, db));
      return outs;
    });
  }
}

// A backend may keep a convolution's output in a layout of its own (onednn: nChw16c) through the
// ops that follow; every op, view and reader must see the same values as on the reference.
TEST_CASE("ops chained on convolution outputs match the reference, through views, codecs and partial writes") {
  using chain = cleave::testing::residual_chain;
  const std::int64_t n = chain::n, c = chain::c, h = chain::h;
  const auto vfc = random_vec(10 * c * h * h, 96), vpart = random_vec(c * h * h, 97);
  compare_with_reference("chain", [&](core::backend& b) {
    const chain ch(b, 90, 1.0f);
    tensor dx = b.empty(ch.x.shape());
    b.copy(ch.y, dx);
    b.mul(dx, ch.x, dx);  // a kept layout times a row-major one
    // Readers of a kept layout: a batch slice, a flattened view into a dense layer, the int8
    // codec's host path, inference batch norm and pooling.
    tensor yi = b.empty(ch.x.shape()), pooled = b.empty({n, c, 1, 1}), fc_w = make(b, {10, c * h * h}, vfc),
           logits = b.empty({n, 10});
    b.batchnorm_forward_infer({1e-5f, 0.1f}, ch.y2, ch.g, ch.be, ch.rm, ch.rv, yi);
    b.pool2d_forward({core::pool_kind::avg, static_cast<int>(h), static_cast<int>(h), 1, 1, 0, 0}, ch.y2, pooled,
                     nullptr);
    b.linear_forward(ch.s.reshaped({n, c * h * h}), fc_w, {}, logits);
    tensor amax = b.empty({c});
    b.channel_absmax(ch.r6, amax);
    const auto slice = read(b, ch.y2.slice_batch(1, 2));
    // A write over one image of a kept tensor leaves the others' values.
    tensor part = make(b, {1, c, h, h}, vpart);
    b.copy(part, ch.dy.slice_batch(2, 1));
    return outs_t{read(b, ch.y),  read(b, ch.z),  read(b, ch.s),   read(b, ch.y2),  read(b, ch.dr6), read(b, ch.dz),
                  read(b, ch.dy), read(b, dx),    read(b, ch.dw),  read(b, ch.dw2), read(b, ch.dg),  read(b, ch.db),
                  read(b, yi),    read(b, ch.rm), read(b, pooled), read(b, logits), read(b, amax),   slice};
  });
}

TEST_CASE("max and average pooling forward and backward match the reference") {
  struct pool_case {
    core::pool2d_desc d;
    shape x;
  };
  const pool_case cases[] = {
      {{core::pool_kind::max, 2, 2, 2, 2, 0, 0}, {2, 6, 28, 28}},
      {{core::pool_kind::max, 3, 3, 2, 2, 1, 1}, {2, 4, 9, 11}},
      {{core::pool_kind::avg, 2, 2, 2, 2, 0, 0}, {2, 3, 10, 10}},
      {{core::pool_kind::avg, 3, 3, 2, 2, 1, 1}, {1, 5, 7, 8}},
      {{core::pool_kind::avg, 7, 7, 1, 1, 0, 0}, {4, 16, 7, 7}},  // global average pool
  };
  for (const auto& pc : cases) {
    CAPTURE(pc.d.kernel_h);
    CAPTURE(static_cast<int>(pc.d.kind));
    const shape sy{pc.x[0], pc.x[1], core::window_out(pc.x[2], pc.d.kernel_h, pc.d.stride_h, pc.d.pad_h),
                   core::window_out(pc.x[3], pc.d.kernel_w, pc.d.stride_w, pc.d.pad_w)};
    const auto vx = random_vec(pc.x.numel(), 40), vdy = random_vec(sy.numel(), 41);
    compare_with_reference("pool2d", [&](core::backend& b) {
      tensor x = make(b, pc.x, vx), y = b.empty(sy), dy = make(b, sy, vdy), dx = b.empty(pc.x), ws;
      b.pool2d_forward(pc.d, x, y, &ws);
      b.pool2d_backward(pc.d, x, dy, ws, dx);
      tensor y_infer = b.empty(sy);
      b.pool2d_forward(pc.d, x, y_infer, nullptr);
      return outs_t{read(b, y), read(b, dx), read(b, y_infer)};
    });
  }
}

TEST_CASE("batch norm training, inference and backward match the reference") {
  for (const shape& s : {shape{8, 6, 5, 5}, shape{16, 12}, shape{3, 4, 7, 3}}) {
    CAPTURE(s.str());
    const std::int64_t c = s[1];
    const auto vx = random_vec(s.numel(), 50, -2.0f, 3.0f), vdy = random_vec(s.numel(), 51),
               vg = random_vec(c, 52, 0.5f, 1.5f), vb = random_vec(c, 53), vrm = random_vec(c, 54),
               vrv = random_vec(c, 55, 0.5f, 1.5f), vdg = random_vec(c, 56), vdb = random_vec(c, 57);
    compare_with_reference("batchnorm", [&](core::backend& b) {
      const core::batchnorm_desc d{1e-5f, 0.1f};
      tensor x = make(b, s, vx), g = make(b, {c}, vg), be = make(b, {c}, vb), y = b.empty(s), mean = b.empty({c}),
             invstd = b.empty({c}), rm = make(b, {c}, vrm), rv = make(b, {c}, vrv), dy = make(b, s, vdy),
             dx = b.empty(s), dg = make(b, {c}, vdg), db = make(b, {c}, vdb), yi = b.empty(s);
      b.batchnorm_forward_train(d, x, g, be, y, mean, invstd, rm, rv);
      b.batchnorm_backward(d, x, dy, g, mean, invstd, dx, dg, db);
      b.batchnorm_forward_infer(d, x, g, be, rm, rv, yi);
      return outs_t{read(b, y),  read(b, mean), read(b, invstd), read(b, rm), read(b, rv),
                    read(b, dx), read(b, dg),   read(b, db),     read(b, yi)};
    });
  }
}

TEST_CASE("softmax cross-entropy forward and backward match the reference") {
  const std::int64_t n = 64, k = 10;
  const auto vl = random_vec(n * k, 60, -8.0f, 8.0f);
  std::vector<std::int32_t> labels(n);
  core::rng r(61);
  for (auto& l : labels) l = static_cast<std::int32_t>(r.below(k));
  compare_with_reference("softmax_xent", [&](core::backend& b) {
    tensor logits = make(b, {n, k}, vl), lab = testing::make_typed(b, {n}, core::dtype::i32, labels),
           probs = b.empty({n, k}), loss = b.empty({1}), dl = b.empty({n, k});
    b.softmax_xent_forward(logits, lab, probs, loss);
    b.softmax_xent_backward(probs, lab, dl, 2.0f);
    return outs_t{read(b, probs), read(b, loss), read(b, dl)};
  });
}

TEST_CASE("SGD and AdamW updates match the reference over several steps") {
  const std::int64_t n = 1000;
  const auto vp = random_vec(n, 70);
  compare_with_reference(
      "optimizers",
      [&](core::backend& b) {
        tensor p1 = make(b, {n}, vp), p2 = make(b, {n}, vp), p3 = make(b, {n}, vp), p4 = make(b, {n}, vp);
        tensor buf1 = b.zeros({n}), buf2 = b.zeros({n}), m = b.zeros({n}), v = b.zeros({n});
        for (int step = 1; step <= 3; ++step) {
          tensor g = make(b, {n}, random_vec(n, 70 + static_cast<std::uint64_t>(step)));
          b.sgd_update({0.1f, 0.9f, 5e-4f, false}, p1, g, buf1);
          b.sgd_update({0.1f, 0.9f, 0.0f, true}, p2, g, buf2);
          b.sgd_update({0.05f, 0.0f, 0.01f, false}, p3, g, tensor{});
          b.adamw_update({1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, step}, p4, g, m, v);
        }
        return outs_t{read(b, p1), read(b, buf1), read(b, p2), read(b, p3), read(b, p4), read(b, m), read(b, v)};
      },
      1e-5f, 1e-6f);
}
