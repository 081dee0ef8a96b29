// The scalar math the CUDA kernels run (cuda_device_math.h), executed on the host and checked
// against core and the reference backend: conversions and the dropout hash bit for bit,
// pooling windows, batch norm statistics and optimizer steps.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../support/backend_harness.h"
#include "cleave/core/codec.h"
#include "cleave/core/convert.h"
#include "cleave/core/random.h"
#include "cuda_device_math.h"

namespace {

using namespace cleave;
namespace m = backend::cuda_math;
using core::shape;
using core::tensor;
using testing::make;
using testing::random_vec;
using testing::read;

std::unique_ptr<core::backend> ref() {
  return backend::make_backend("reference");
}

// Float bit patterns: a strided sweep of all 2^32 plus the neighbourhoods of the rounding and
// range boundaries of f16 and bf16.
std::vector<std::uint32_t> float_patterns() {
  std::vector<std::uint32_t> v;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 251) v.push_back(static_cast<std::uint32_t>(u));
  for (std::uint32_t base : {0x477ff000u, 0x477fefffu, 0x38800000u, 0x33000000u, 0x33800000u, 0x7f800000u, 0x3f801000u,
                             0x3f803000u, 0x3f808000u, 0x3f818000u})
    for (std::uint32_t d = 0; d < 4096; ++d)
      for (std::uint32_t sign : {0u, 0x80000000u}) {
        v.push_back((base - 2048 + d) ^ sign);
      }
  return v;
}

}  // namespace

TEST_CASE("f16 and bf16 widening equals core for every 16-bit pattern") {
  std::size_t bad_f16 = 0, bad_bf16 = 0;
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto u = static_cast<std::uint16_t>(h);
    if (std::bit_cast<std::uint32_t>(m::f16_to_f32(u)) != std::bit_cast<std::uint32_t>(core::f16_to_f32(u))) ++bad_f16;
    if (std::bit_cast<std::uint32_t>(m::bf16_to_f32(u)) != std::bit_cast<std::uint32_t>(core::bf16_to_f32(u)))
      ++bad_bf16;
  }
  CHECK(bad_f16 == 0);
  CHECK(bad_bf16 == 0);
}

TEST_CASE("f32 narrowing to f16 and bf16 equals core over a sweep of bit patterns") {
  std::size_t bad_f16 = 0, bad_bf16 = 0, n = 0;
  for (std::uint32_t u : float_patterns()) {
    const float f = std::bit_cast<float>(u);
    bad_f16 += m::f32_to_f16(f) != core::f32_to_f16(f);
    bad_bf16 += m::f32_to_bf16(f) != core::f32_to_bf16(f);
    ++n;
  }
  CHECK(n > 10000000);
  CHECK(bad_f16 == 0);
  CHECK(bad_bf16 == 0);
}

TEST_CASE("f32 to integers rounds half to even and saturates as core") {
  std::vector<float> values = {std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               2147483520.0f,
                               2147483648.0f,
                               -2147483648.0f,
                               -2147483904.0f,
                               3e9f,
                               -3e9f};
  for (float f = -70000.0f; f <= 70000.0f; f += 0.25f) values.push_back(f);
  std::size_t bad = 0;
  for (float f : values)
    for (auto [lo, hi] : {std::pair<std::int64_t, std::int64_t>{-128, 127},
                          {0, 255},
                          {std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max()}})
      bad += m::f32_to_int_sat(f, lo, hi) != core::f32_to_int_sat(f, lo, hi);
  CHECK(bad == 0);
}

TEST_CASE("cast_at equals the reference backend's cast for every pair of dtypes") {
  auto r = ref();
  std::vector<float> src_values = random_vec(4000, 1, -70000.0f, 70000.0f);
  const auto small = random_vec(4000, 2, -300.0f, 300.0f);
  src_values.insert(src_values.end(), small.begin(), small.end());
  for (float f : {0.5f, 1.5f, 2.5f, -2.5f, 127.5f, 255.5f, -128.5f, 65520.0f, 1e-8f, 3e9f, -3e9f})
    src_values.push_back(f);
  src_values.push_back(std::numeric_limits<float>::quiet_NaN());
  const shape s{static_cast<std::int64_t>(src_values.size())};
  for (int from = 0; from < core::n_dtypes; ++from)
    for (int to = 0; to < core::n_dtypes; ++to) {
      if (from == to) continue;
      CAPTURE(from);
      CAPTURE(to);
      const auto tf = static_cast<core::dtype>(from), tt = static_cast<core::dtype>(to);
      tensor src = r->empty(s, tf), want = r->empty(s, tt);
      r->cast(make(*r, s, src_values), src);
      r->cast(src, want);
      std::vector<std::uint8_t> got(want.bytes());
      for (std::int64_t i = 0; i < s.numel(); ++i) m::cast_at(src.host_data(), from, got.data(), to, i);
      CHECK(std::memcmp(got.data(), want.host_data(), got.size()) == 0);
    }
}

TEST_CASE("the dropout hash and keep decision equal core's") {
  std::size_t bad = 0;
  core::rng r(9);
  for (int i = 0; i < 1000000; ++i) {
    const auto seed = static_cast<std::uint32_t>(r.next_u64()), index = static_cast<std::uint32_t>(r.next_u64());
    const std::uint32_t thr = core::dropout_threshold(static_cast<float>(i % 10) / 10.0f);
    bad += m::hash32(seed, index) != core::hash32(seed, index);
    bad += m::dropout_keep(seed, index, thr) != core::dropout_keep(seed, index, thr);
  }
  CHECK(bad == 0);
}

TEST_CASE("the int8 codec's element formulas equal core's quantisation and channel maxima") {
  // Channel maxima: the largest key of a channel's values gives core::channel_absmax's value.
  const auto pats = float_patterns();
  std::size_t bad = 0;
  for (std::size_t i = 0; i + 8 <= pats.size(); i += 8) {
    float x[8];
    std::uint32_t key = 0;
    for (int j = 0; j < 8; ++j) {
      std::memcpy(&x[j], &pats[i + j], 4);
      key = std::max(key, m::absmax_key(x[j]));
    }
    float want = 0;
    core::channel_absmax(x, core::channel_layout{1, 1, 8}, &want);
    bad += std::bit_cast<std::uint32_t>(m::absmax_of_key(key)) != std::bit_cast<std::uint32_t>(want);
  }
  CHECK(bad == 0);
  // Codes: x * inv over a sweep of values and inverse scales, nearest and stochastic, with
  // the ties of round-to-nearest-even (x * inv a half step).
  core::rng r(5);
  for (bool stochastic : {false, true}) {
    CAPTURE(stochastic);
    std::size_t wrong = 0;
    for (int i = 0; i < 200000; ++i) {
      float x = r.uniform(-200.0f, 200.0f), inv = r.uniform(0.0f, 3.0f);
      if (i % 4 == 0) x = static_cast<float>(i % 301 - 150) + 0.5f, inv = 1.0f;
      if (i % 97 == 0) inv = 0.0f;
      if (i % 89 == 0) x = std::numeric_limits<float>::infinity();
      const auto seed = static_cast<std::uint32_t>(i * 7919), e = static_cast<std::uint32_t>(i);
      std::int8_t want = 0;
      // core's quantisation of one value at flat index e: a layout of e + 1 values, the last one x.
      std::vector<float> xs(static_cast<std::size_t>(e % 64) + 1, 0.0f);
      xs.back() = x;
      std::vector<std::int8_t> q(xs.size());
      core::quantize_int8(xs.data(), core::channel_layout{1, 1, static_cast<std::int64_t>(xs.size())}, &inv, q.data(),
                          stochastic, seed);
      want = q.back();
      wrong += m::quantize_one(x, inv, stochastic, seed, e % 64) != want;
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("covering_range finds exactly the outputs whose window covers an input") {
  for (int kernel = 1; kernel <= 7; ++kernel)
    for (int stride = 1; stride <= 4; ++stride)
      for (int pad = 0; pad <= kernel / 2; ++pad)
        for (std::int64_t in = kernel; in <= 13; ++in) {
          const std::int64_t out = core::window_out(in, kernel, stride, pad);
          for (std::int64_t i = 0; i < in; ++i) {
            std::int64_t lo, hi;
            m::covering_range(i, kernel, stride, pad, out, &lo, &hi);
            for (std::int64_t p = 0; p < out; ++p) {
              const bool covers = p * stride - pad <= i && i <= p * stride - pad + kernel - 1;
              const bool in_range = p >= lo && p <= hi;
              if (covers != in_range) {
                CAPTURE(kernel);
                CAPTURE(stride);
                CAPTURE(pad);
                CAPTURE(i);
                CAPTURE(p);
                FAIL("covering_range disagrees with the window definition");
              }
            }
          }
        }
}

TEST_CASE("the pooling window functions reproduce the reference forward and backward exactly") {
  auto r = ref();
  struct pool_case {
    core::pool2d_desc d;
    shape x;
  };
  const pool_case cases[] = {
      {{core::pool_kind::max, 2, 2, 2, 2, 0, 0}, {2, 3, 8, 8}},
      {{core::pool_kind::max, 3, 3, 2, 2, 1, 1}, {2, 2, 9, 11}},
      {{core::pool_kind::max, 3, 3, 1, 1, 1, 1}, {1, 2, 6, 5}},  // overlapping windows
      {{core::pool_kind::avg, 3, 3, 2, 2, 1, 1}, {1, 3, 7, 8}},
      {{core::pool_kind::avg, 3, 2, 1, 2, 1, 0}, {2, 2, 6, 7}},
  };
  for (const auto& pc : cases) {
    const bool is_max = pc.d.kind == core::pool_kind::max;
    CAPTURE(is_max);
    CAPTURE(pc.x.str());
    const m::pool_geom g{pc.x[2],
                         pc.x[3],
                         core::window_out(pc.x[2], pc.d.kernel_h, pc.d.stride_h, pc.d.pad_h),
                         core::window_out(pc.x[3], pc.d.kernel_w, pc.d.stride_w, pc.d.pad_w),
                         pc.d.kernel_h,
                         pc.d.kernel_w,
                         pc.d.stride_h,
                         pc.d.stride_w,
                         pc.d.pad_h,
                         pc.d.pad_w};
    const shape sy{pc.x[0], pc.x[1], g.ph, g.pw};
    // Rounded values make ties, which must go to the first element of the window.
    auto vx = random_vec(pc.x.numel(), 3, -2.0f, 2.0f);
    for (auto& v : vx) v = std::round(v * 2.0f) / 2.0f;
    const auto vdy = random_vec(sy.numel(), 4);
    tensor x = make(*r, pc.x, vx), y = r->empty(sy), dy = make(*r, sy, vdy), dx = r->empty(pc.x), ws;
    r->pool2d_forward(pc.d, x, y, &ws);
    r->pool2d_backward(pc.d, x, dy, ws, dx);
    const std::int64_t planes = pc.x[0] * pc.x[1], per = g.h * g.w, per_out = g.ph * g.pw;
    std::vector<float> y_got(static_cast<std::size_t>(sy.numel())), dx_got(static_cast<std::size_t>(pc.x.numel()));
    std::vector<std::int32_t> idx(y_got.size());
    for (std::int64_t pl = 0; pl < planes; ++pl)
      for (std::int64_t o = 0; o < per_out; ++o) {
        const auto i = static_cast<std::size_t>(pl * per_out + o);
        y_got[i] = is_max ? m::max_pool_at(vx.data() + pl * per, g, o / g.pw, o % g.pw, &idx[i])
                          : m::avg_pool_at(vx.data() + pl * per, g, o / g.pw, o % g.pw);
      }
    for (std::int64_t pl = 0; pl < planes; ++pl)
      for (std::int64_t o = 0; o < per; ++o)
        dx_got[static_cast<std::size_t>(pl * per + o)] =
            is_max ? m::max_pool_grad_at(vdy.data() + pl * per_out, idx.data() + pl * per_out, g, o / g.w, o % g.w)
                   : m::avg_pool_grad_at(vdy.data() + pl * per_out, g, o / g.w, o % g.w);
    CLEAVE_CHECK_CLOSE(y_got, read(*r, y), 0.0f, 0.0f, "pool forward");
    CLEAVE_CHECK_CLOSE(dx_got, read(*r, dx), 0.0f, 0.0f, "pool backward");
    if (is_max) {
      const auto want_idx = testing::read_typed<std::int32_t>(*r, ws);
      CHECK(idx == want_idx);
    }
  }
}

TEST_CASE("batch norm statistics from shifted sums and the element formulas match the reference") {
  auto r = ref();
  const shape s{6, 3, 4, 5};
  const std::int64_t n = s[0], c = s[1], hw = s[2] * s[3];
  // A large common offset: the shifted one-pass variance must stay accurate.
  const auto vx = random_vec(s.numel(), 5, 99.0f, 101.0f), vdy = random_vec(s.numel(), 6),
             vg = random_vec(c, 7, 0.5f, 1.5f), vb = random_vec(c, 8), vrm = random_vec(c, 9),
             vrv = random_vec(c, 10, 0.5f, 1.5f);
  const core::batchnorm_desc d{1e-5f, 0.1f};
  tensor x = make(*r, s, vx), g = make(*r, {c}, vg), b = make(*r, {c}, vb), y = r->empty(s), mean = r->empty({c}),
         invstd = r->empty({c}), rm = make(*r, {c}, vrm), rv = make(*r, {c}, vrv), dy = make(*r, s, vdy),
         dx = r->empty(s), dg = r->zeros({c}), db = r->zeros({c});
  r->batchnorm_forward_train(d, x, g, b, y, mean, invstd, rm, rv);
  r->batchnorm_backward(d, x, dy, g, mean, invstd, dx, dg, db);
  std::vector<float> y_got(vx.size()), dx_got(vx.size()), mean_got(c), invstd_got(c), rm_got(c), rv_got(c);
  const auto want_mean = read(*r, mean), want_invstd = read(*r, invstd);
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const double x0 = vx[static_cast<std::size_t>(ch * hw)];
    double s1 = 0, s2 = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < hw; ++j) {
        const double dv = vx[static_cast<std::size_t>((i * c + ch) * hw + j)] - x0;
        s1 += dv;
        s2 += dv * dv;
      }
    const auto st = m::bn_finalize(s1, s2, x0, static_cast<double>(n * hw), d.eps);
    const auto k = static_cast<std::size_t>(ch);
    mean_got[k] = static_cast<float>(st.mean);
    invstd_got[k] = static_cast<float>(st.invstd);
    rm_got[k] = m::bn_running(vrm[k], d.momentum, st.mean);
    rv_got[k] = m::bn_running(vrv[k], d.momentum, st.unbiased);
    double sdy = 0, sdyx = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < hw; ++j) {
        const auto e = static_cast<std::size_t>((i * c + ch) * hw + j);
        y_got[e] = m::bn_normalize(vx[e], vg[k], vb[k], st.mean, st.invstd);
        sdy += vdy[e];
        sdyx += vdy[e] * m::bn_xhat(vx[e], want_mean[k], want_invstd[k]);
      }
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < hw; ++j) {
        const auto e = static_cast<std::size_t>((i * c + ch) * hw + j);
        dx_got[e] = m::bn_grad_input(vx[e], vdy[e], vg[k], want_mean[k], want_invstd[k], sdy, sdyx,
                                     static_cast<double>(n * hw));
      }
  }
  CLEAVE_CHECK_CLOSE(mean_got, want_mean, 1e-7f, 0.0f, "save_mean");
  CLEAVE_CHECK_CLOSE(invstd_got, want_invstd, 1e-5f, 0.0f, "save_invstd");
  CLEAVE_CHECK_CLOSE(rm_got, read(*r, rm), 1e-6f, 0.0f, "running_mean");
  CLEAVE_CHECK_CLOSE(rv_got, read(*r, rv), 1e-5f, 0.0f, "running_var");
  CLEAVE_CHECK_CLOSE(y_got, read(*r, y), 1e-4f, 1e-5f, "y");
  CLEAVE_CHECK_CLOSE(dx_got, read(*r, dx), 0.0f, 0.0f, "dx (same sums, same order)");
}

TEST_CASE("SGD and AdamW element steps equal the reference bit for bit") {
  auto r = ref();
  const std::int64_t n = 777;
  const auto vp = random_vec(n, 11);
  std::vector<float> p1 = vp, p2 = vp, p3 = vp, buf1(n), buf2(n), mm(n), vv(n);
  tensor t1 = make(*r, {n}, vp), t2 = make(*r, {n}, vp), t3 = make(*r, {n}, vp), b1 = r->zeros({n}), b2 = r->zeros({n}),
         tm = r->zeros({n}), tv = r->zeros({n});
  for (int step = 1; step <= 4; ++step) {
    const auto vg = random_vec(n, 20 + static_cast<std::uint64_t>(step));
    tensor g = make(*r, {n}, vg);
    const core::sgd_desc s1{0.1f, 0.9f, 5e-4f, false}, s2{0.1f, 0.9f, 0.0f, true};
    const core::adamw_desc a{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, step};
    r->sgd_update(s1, t1, g, b1);
    r->sgd_update(s2, t2, g, b2);
    r->adamw_update(a, t3, g, tm, tv);
    const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), step);
    const m::adamw_params ap{a.beta1,
                             a.beta2,
                             a.eps,
                             1.0f - a.lr * a.weight_decay,
                             static_cast<float>(a.lr / (1.0 - std::pow(static_cast<double>(a.beta1), step))),
                             static_cast<float>(std::sqrt(bc2))};
    for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
      m::sgd_step(&p1[i], vg[i], &buf1[i], {s1.lr, s1.momentum, s1.weight_decay, s1.nesterov});
      m::sgd_step(&p2[i], vg[i], &buf2[i], {s2.lr, s2.momentum, s2.weight_decay, s2.nesterov});
      m::adamw_step(&p3[i], vg[i], &mm[i], &vv[i], ap);
    }
  }
  CLEAVE_CHECK_CLOSE(p1, read(*r, t1), 0.0f, 0.0f, "sgd momentum");
  CLEAVE_CHECK_CLOSE(buf1, read(*r, b1), 0.0f, 0.0f, "sgd buffer");
  CLEAVE_CHECK_CLOSE(p2, read(*r, t2), 0.0f, 0.0f, "sgd nesterov");
  CLEAVE_CHECK_CLOSE(p3, read(*r, t3), 0.0f, 0.0f, "adamw param");
  CLEAVE_CHECK_CLOSE(mm, read(*r, tm), 0.0f, 0.0f, "adamw m");
  CLEAVE_CHECK_CLOSE(vv, read(*r, tv), 0.0f, 0.0f, "adamw v");
}
