// oneDNN backend: convolutions with few channels (LeNet-5's 1 -> 6 first layer forward and
// backward weights, and the backward data of a layer with 6 input channels) on AVX-512 loops
// over the caller's NCHW tensors. oneDNN's direct kernels block channels in 16s: a layer with 1
// input and 6 output channels computes 16 and runs at 28 GFLOP/s on one core (forward) and 38
// (backward weights), a backward data into 6 channels at 42, against 109 for LeNet's second
// forward. Here every output row is computed as whole 16-float vectors along the width, each
// input vector loaded once and multiplied into every output channel.
//
// All three are one correlation over zero-padded planes:
//   out[o][p][q] = bias[o] + sum_i sum_r sum_s in[i][p + r][q + s] * k[o][i][r][s]
// forward: in = x padded by (pad_h, pad_w), k = w; backward data: in = dy padded by
// (R - 1 - pad_h, S - 1 - pad_w), k = w with input and output channels swapped and the window
// turned by 180 degrees.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "onednn_backend.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define CLEAVE_NARROW_CONV 1
#endif

namespace cleave::backend::detail {

namespace {

#if CLEAVE_NARROW_CONV

constexpr int k_lanes = 16;
constexpr std::int64_t k_max_out = 8;  // output channels held in registers at once

// Planes padded with zeros: `top`/`left` rows and columns before the data, enough after it
// that every 16-float load of a correlation stays inside. Refilled image after image with the
// same geometry, only the data is copied: the padding stays zero.
struct padded_planes {
  std::int64_t rows = 0, cols = 0;
  std::vector<float> data;

  // planes: (n_planes, h, w) -> (n_planes, rows, cols), for an output of out_rows x out_cols
  // with an r x s window.
  void fill(const float* src, std::int64_t n_planes, std::int64_t h, std::int64_t w, std::int64_t top,
            std::int64_t left, std::int64_t out_rows, std::int64_t out_cols, std::int64_t r, std::int64_t s) {
    const std::int64_t last_load = (out_cols - 1) / k_lanes * k_lanes + s - 1 + k_lanes;
    const std::int64_t new_rows = std::max(top + h, out_rows + r - 1);
    const std::int64_t new_cols = (std::max(left + w, last_load) + k_lanes - 1) / k_lanes * k_lanes;
    const std::array<std::int64_t, 6> geometry{n_planes, h, w, top, left, new_rows * new_cols};
    if (geometry != geometry_) {
      rows = new_rows;
      cols = new_cols;
      data.assign(static_cast<std::size_t>(n_planes * rows * cols), 0.0f);
      geometry_ = geometry;
    }
    for (std::int64_t i = 0; i < n_planes; ++i)
      for (std::int64_t y = 0; y < h; ++y)
        std::memcpy(&data[static_cast<std::size_t>((i * rows + top + y) * cols + left)], src + (i * h + y) * w,
                    static_cast<std::size_t>(w) * sizeof(float));
  }
  const float* row(std::int64_t plane, std::int64_t y) const {
    return &data[static_cast<std::size_t>((plane * rows + y) * cols)];
  }

 private:
  std::array<std::int64_t, 6> geometry_{};
};

__mmask16 tail_mask(std::int64_t n) {
  return n >= k_lanes ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

// The sum of the 16 lanes, in lane order.
__attribute__((target("avx512f"))) float lane_sum(__m512 v) {
  alignas(64) float t[k_lanes];
  _mm512_store_ps(t, v);
  float s = 0.0f;
  for (float x : t) s += x;
  return s;
}

// Rows [y0, y0 + RB) of out (NO, p, q) = correlation of `in` (n_in padded planes) with
// k (NO, n_in, r, s) + bias. RB rows at once give RB x NO independent accumulators (FMA latency
// is hidden) and use each broadcast weight RB times.
template <int NO, int RB>
__attribute__((target("avx512f"))) void correlate_rows(const padded_planes& in, std::int64_t n_in, const float* k,
                                                       const float* bias, std::int64_t r, std::int64_t s, float* out,
                                                       std::int64_t p, std::int64_t q, std::int64_t y0) {
  const std::int64_t window = n_in * r * s;
  for (std::int64_t x0 = 0; x0 < q; x0 += k_lanes) {
    __m512 acc[RB][NO];
#pragma GCC unroll 8
    for (int o = 0; o < NO; ++o) {
      const __m512 b0 = _mm512_set1_ps(bias ? bias[o] : 0.0f);
#pragma GCC unroll 4
      for (int j = 0; j < RB; ++j) acc[j][o] = b0;
    }
    for (std::int64_t i = 0; i < n_in; ++i)
      for (std::int64_t dy = 0; dy < r; ++dy) {
        const float* row = in.row(i, y0 + dy) + x0;
        const float* kr = k + (i * r + dy) * s;
        for (std::int64_t dx = 0; dx < s; ++dx) {
          __m512 v[RB];
#pragma GCC unroll 4
          for (int j = 0; j < RB; ++j) v[j] = _mm512_loadu_ps(row + j * in.cols + dx);
#pragma GCC unroll 8
          for (int o = 0; o < NO; ++o) {
            const __m512 wv = _mm512_set1_ps(kr[o * window + dx]);
#pragma GCC unroll 4
            for (int j = 0; j < RB; ++j) acc[j][o] = _mm512_fmadd_ps(v[j], wv, acc[j][o]);
          }
        }
      }
    const __mmask16 m = tail_mask(q - x0);
#pragma GCC unroll 8
    for (int o = 0; o < NO; ++o)
#pragma GCC unroll 4
      for (int j = 0; j < RB; ++j) _mm512_mask_storeu_ps(out + o * p * q + (y0 + j) * q + x0, m, acc[j][o]);
  }
}

// Rows per block for NO output channels: at most 24 accumulators of the 32 registers.
constexpr int rows_for(int no) {
  return no <= 6 ? 4 : 3;
}

template <int NO>
void correlate_planes(const padded_planes& in, std::int64_t n_in, const float* k, const float* bias, std::int64_t r,
                      std::int64_t s, float* out, std::int64_t p, std::int64_t q) {
  constexpr int rb = rows_for(NO);
  std::int64_t y = 0;
  for (; y + rb <= p; y += rb) correlate_rows<NO, rb>(in, n_in, k, bias, r, s, out, p, q, y);
  for (; y < p; ++y) correlate_rows<NO, 1>(in, n_in, k, bias, r, s, out, p, q, y);
}

// All n_out output planes, k_max_out at a time.
void correlate(const padded_planes& in, std::int64_t n_in, const float* k, const float* bias, std::int64_t n_out,
               std::int64_t r, std::int64_t s, float* out, std::int64_t p, std::int64_t q) {
  using fn = void (*)(const padded_planes&, std::int64_t, const float*, const float*, std::int64_t, std::int64_t,
                      float*, std::int64_t, std::int64_t);
  static constexpr fn by_count[] = {nullptr,
                                    correlate_planes<1>,
                                    correlate_planes<2>,
                                    correlate_planes<3>,
                                    correlate_planes<4>,
                                    correlate_planes<5>,
                                    correlate_planes<6>,
                                    correlate_planes<7>,
                                    correlate_planes<8>};
  const std::int64_t window = n_in * r * s;
  for (std::int64_t o = 0; o < n_out; o += k_max_out) {
    const std::int64_t m = std::min(k_max_out, n_out - o);
    by_count[m](in, n_in, k + o * window, bias ? bias + o : nullptr, r, s, out + o * p * q, p, q);
  }
}

// Output channels whose S-wide weight rows are accumulated at once: NO x S of the 32 registers.
constexpr int weights_block(int s, int no) {
  return std::min(no, std::min(8, 30 / s));
}

// part[o][i][dy][dx] += sum_y sum_x g[o][y][x] * in[i][y + dy][x + dx] for NO output channels and
// a window S wide: the weight gradient of one image, g its (NO, p, q) output gradient. Each
// input vector is loaded once for all NO channels; g's vectors (zero past the row's end) are
// staged in an aligned buffer and read as FMA operands.
template <int S, int NO>
__attribute__((target("avx512f"))) void correlate_weights_block(const padded_planes& in, std::int64_t n_in,
                                                                const float* g, std::int64_t r, std::int64_t p,
                                                                std::int64_t q, float* part) {
  alignas(64) float gt[NO][k_lanes];
  for (std::int64_t i = 0; i < n_in; ++i)
    for (std::int64_t dy = 0; dy < r; ++dy) {
      __m512 acc[NO][S];
#pragma GCC unroll 8
      for (int o = 0; o < NO; ++o)
#pragma GCC unroll 8
        for (int j = 0; j < S; ++j) acc[o][j] = _mm512_setzero_ps();
      for (std::int64_t y = 0; y < p; ++y) {
        const float* row = in.row(i, y + dy);
        for (std::int64_t x0 = 0; x0 < q; x0 += k_lanes) {
          const __mmask16 m = tail_mask(q - x0);
#pragma GCC unroll 8
          for (int o = 0; o < NO; ++o) _mm512_store_ps(gt[o], _mm512_maskz_loadu_ps(m, g + (o * p + y) * q + x0));
#pragma GCC unroll 8
          for (int j = 0; j < S; ++j) {
            const __m512 xv = _mm512_loadu_ps(row + x0 + j);
#pragma GCC unroll 8
            for (int o = 0; o < NO; ++o) acc[o][j] = _mm512_fmadd_ps(xv, _mm512_load_ps(gt[o]), acc[o][j]);
          }
        }
      }
#pragma GCC unroll 8
      for (int o = 0; o < NO; ++o)
#pragma GCC unroll 8
        for (int j = 0; j < S; ++j) part[((o * n_in + i) * r + dy) * S + j] += lane_sum(acc[o][j]);
    }
}

using weights_fn = void (*)(const padded_planes&, std::int64_t, const float*, std::int64_t, std::int64_t, std::int64_t,
                            float*);

// The kernels for a window S wide, by the number of output channels (1-8) in a block.
template <int S>
constexpr std::array<weights_fn, 9> weights_kernels() {
  return {nullptr,
          correlate_weights_block<S, weights_block(S, 1)>,
          correlate_weights_block<S, weights_block(S, 2)>,
          correlate_weights_block<S, weights_block(S, 3)>,
          correlate_weights_block<S, weights_block(S, 4)>,
          correlate_weights_block<S, weights_block(S, 5)>,
          correlate_weights_block<S, weights_block(S, 6)>,
          correlate_weights_block<S, weights_block(S, 7)>,
          correlate_weights_block<S, weights_block(S, 8)>};
}

// The bias gradient of one image: part_b[o] += sum of g[o].
__attribute__((target("avx512f"))) void sum_planes(const float* g, std::int64_t n_out, std::int64_t pq, float* part_b) {
  for (std::int64_t o = 0; o < n_out; ++o) {
    __m512 sum = _mm512_setzero_ps();
    for (std::int64_t x0 = 0; x0 < pq; x0 += k_lanes)
      sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(tail_mask(pq - x0), g + o * pq + x0));
    part_b[o] += lane_sum(sum);
  }
}

void correlate_weights(const padded_planes& in, std::int64_t n_in, const float* g, std::int64_t n_out, std::int64_t r,
                       std::int64_t s, std::int64_t p, std::int64_t q, float* part, float* part_b) {
  static constexpr std::array<std::array<weights_fn, 9>, 9> by_width{{{},
                                                                      weights_kernels<1>(),
                                                                      weights_kernels<2>(),
                                                                      weights_kernels<3>(),
                                                                      weights_kernels<4>(),
                                                                      weights_kernels<5>(),
                                                                      weights_kernels<6>(),
                                                                      weights_kernels<7>(),
                                                                      weights_kernels<8>()}};
  const std::int64_t block = weights_block(static_cast<int>(s), 8), per_out = n_in * r * s;
  for (std::int64_t o = 0; o < n_out; o += block) {
    const std::int64_t m = std::min(block, n_out - o);
    by_width[static_cast<std::size_t>(s)][static_cast<std::size_t>(m)](in, n_in, g + o * p * q, r, p, q,
                                                                       part + o * per_out);
  }
  if (part_b) sum_planes(g, n_out, p * q, part_b);
}

#endif

}  // namespace

bool onednn_backend::narrow(conv_op op, const core::conv2d_desc& d, const core::conv_dims& c) const {
#if CLEAVE_NARROW_CONV
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!avx512 || conv_ != conv_algorithm::automatic || layout_ != conv_layout::automatic) return false;
  if (c.g != 1 || d.stride_h != 1 || d.stride_w != 1 || c.p * c.q == 0) return false;
  // Forward and backward weights: an input layer's 1-4 channels into at most 8. Backward data:
  // into at most 8 channels (which oneDNN pads to 16), from at most 32, with a padding inside
  // the window (the transposed correlation pads dy by R - 1 - pad).
  if (op == conv_op::backward_data) return c.c <= 8 && c.k <= 32 && d.pad_h < c.r && d.pad_w < c.s;
  return c.c <= 4 && c.k <= 8 && (op == conv_op::forward || c.s <= 8);
#else
  (void)op;
  (void)d;
  (void)c;
  return false;
#endif
}

void onednn_backend::narrow_forward(const core::conv2d_desc& d, const core::conv_dims& c, const float* x,
                                    const float* w, const float* b, float* y) {
#if CLEAVE_NARROW_CONV
  ++narrow_calls_;
  const int threads = threads_for(2.0 * c.n * c.k * c.c * c.p * c.q * c.r * c.s);
#pragma omp parallel num_threads(threads)
  {
    padded_planes in;
#pragma omp for schedule(static)
    for (std::int64_t n = 0; n < c.n; ++n) {
      in.fill(x + n * c.c * c.h * c.w, c.c, c.h, c.w, d.pad_h, d.pad_w, c.p, c.q, c.r, c.s);
      correlate(in, c.c, w, b, c.k, c.r, c.s, y + n * c.k * c.p * c.q, c.p, c.q);
    }
  }
#else
  (void)d, (void)c, (void)x, (void)w, (void)b, (void)y;
#endif
}

void onednn_backend::narrow_backward_data(const core::conv2d_desc& d, const core::conv_dims& c, const float* dy,
                                          const float* w, float* dx) {
#if CLEAVE_NARROW_CONV
  ++narrow_calls_;
  // The kernel of the transposed correlation: (C, K, R, S), each window turned by 180 degrees.
  const std::int64_t rs = c.r * c.s;
  float* wt = scratch_floats(static_cast<std::size_t>(c.c * c.k * rs), 0);
  for (std::int64_t k = 0; k < c.k; ++k)
    for (std::int64_t ci = 0; ci < c.c; ++ci)
      for (std::int64_t i = 0; i < rs; ++i) wt[(ci * c.k + k) * rs + (rs - 1 - i)] = w[(k * c.c + ci) * rs + i];
  const std::int64_t top = c.r - 1 - d.pad_h, left = c.s - 1 - d.pad_w;
  const int threads = threads_for(2.0 * c.n * c.k * c.c * c.p * c.q * rs);
#pragma omp parallel num_threads(threads)
  {
    padded_planes in;
#pragma omp for schedule(static)
    for (std::int64_t n = 0; n < c.n; ++n) {
      in.fill(dy + n * c.k * c.p * c.q, c.k, c.p, c.q, top, left, c.h, c.w, c.r, c.s);
      correlate(in, c.k, wt, nullptr, c.c, c.r, c.s, dx + n * c.c * c.h * c.w, c.h, c.w);
    }
  }
#else
  (void)d, (void)c, (void)dy, (void)w, (void)dx;
#endif
}

void onednn_backend::narrow_backward_weights(const core::conv2d_desc& d, const core::conv_dims& c, const float* x,
                                             const float* dy, float* dw, float* db) {
#if CLEAVE_NARROW_CONV
  ++narrow_calls_;
  const std::int64_t n_w = c.k * c.c * c.r * c.s;
  const int threads = threads_for(2.0 * c.n * c.k * c.c * c.p * c.q * c.r * c.s);
  // Per-thread partials over a static range of images, added in thread order: a run repeats
  // bit for bit.
  const std::size_t stride = static_cast<std::size_t>(n_w + c.k);
  float* partial = scratch_floats(stride * static_cast<std::size_t>(threads), 1);
  std::fill(partial, partial + stride * static_cast<std::size_t>(threads), 0.0f);
#pragma omp parallel num_threads(threads)
  {
    padded_planes in;
    float* part = partial + stride * static_cast<std::size_t>(omp_get_thread_num());
#pragma omp for schedule(static)
    for (std::int64_t n = 0; n < c.n; ++n) {
      in.fill(x + n * c.c * c.h * c.w, c.c, c.h, c.w, d.pad_h, d.pad_w, c.p, c.q, c.r, c.s);
      correlate_weights(in, c.c, dy + n * c.k * c.p * c.q, c.k, c.r, c.s, c.p, c.q, part, db ? part + n_w : nullptr);
    }
  }
  for (int t = 0; t < threads; ++t) {
    const float* part = partial + stride * static_cast<std::size_t>(t);
    for (std::int64_t i = 0; i < n_w; ++i) dw[i] += part[i];
    if (db)
      for (std::int64_t k = 0; k < c.k; ++k) db[k] += part[n_w + k];
  }
#else
  (void)d, (void)c, (void)x, (void)dy, (void)dw, (void)db;
#endif
}

}  // namespace cleave::backend::detail
