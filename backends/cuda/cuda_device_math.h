// Scalar math shared by the CUDA kernels and host tests: dtype conversions, the dropout hash,
// pooling windows, optimizer steps. C++17 (nvcc) and plain C++ (g++) both compile it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CLEAVE_HD __host__ __device__ __forceinline__
#else
#define CLEAVE_HD inline
#endif

namespace cleave::backend::cuda_math {

// dtype codes, equal to core::dtype's values (checked by a static_assert in cuda_backend.cpp).
enum dtype_code : int { dt_f32 = 0, dt_f16 = 1, dt_bf16 = 2, dt_i8 = 3, dt_u8 = 4, dt_i32 = 5 };

CLEAVE_HD std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

CLEAVE_HD float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// ---- conversions: the same bit-level algorithms as core/convert.h ---------------------------

CLEAVE_HD std::uint16_t f32_to_f16(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<std::uint16_t>(sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (absx < 0x38800000u) {
    if (absx < 0x33000000u) return static_cast<std::uint16_t>(sign);
    const std::uint32_t full = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - (absx >> 23);
    std::uint32_t result = full >> shift;
    const std::uint32_t rem = full & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
    return static_cast<std::uint16_t>(sign | result);
  }
  std::uint32_t h = ((absx >> 13) - (112u << 10));
  const std::uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

CLEAVE_HD float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // mant * 2^-24 is exact in f32.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

CLEAVE_HD std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

CLEAVE_HD float bf16_to_f32(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

// f32 -> integer in [lo, hi]: round to nearest even, saturate, NaN -> 0.
CLEAVE_HD std::int64_t f32_to_int_sat(float f, std::int64_t lo, std::int64_t hi) {
  if (f != f) return 0;
  const double r = rint(static_cast<double>(f));  // to nearest even
  if (r <= static_cast<double>(lo)) return lo;
  if (r >= static_cast<double>(hi)) return hi;
  return static_cast<std::int64_t>(r);
}

CLEAVE_HD float load_as_f32(const void* p, int dt, std::int64_t i) {
  switch (dt) {
    case dt_f32:
      return static_cast<const float*>(p)[i];
    case dt_f16:
      return f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    case dt_bf16:
      return bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    case dt_i8:
      return static_cast<float>(static_cast<const std::int8_t*>(p)[i]);
    case dt_u8:
      return static_cast<float>(static_cast<const std::uint8_t*>(p)[i]);
    default:
      return static_cast<float>(static_cast<const std::int32_t*>(p)[i]);
  }
}

CLEAVE_HD void store_from_f32(void* p, int dt, std::int64_t i, float v) {
  switch (dt) {
    case dt_f32:
      static_cast<float*>(p)[i] = v;
      break;
    case dt_f16:
      static_cast<std::uint16_t*>(p)[i] = f32_to_f16(v);
      break;
    case dt_bf16:
      static_cast<std::uint16_t*>(p)[i] = f32_to_bf16(v);
      break;
    case dt_i8:
      static_cast<std::int8_t*>(p)[i] = static_cast<std::int8_t>(f32_to_int_sat(v, -128, 127));
      break;
    case dt_u8:
      static_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(f32_to_int_sat(v, 0, 255));
      break;
    default:
      static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(f32_to_int_sat(v, -2147483647ll - 1, 2147483647ll));
      break;
  }
}

// Element i of a cast from src_dt to dst_dt (src_dt != dst_dt). i32 to i8/u8 saturates
// without a trip through float, as the reference does.
CLEAVE_HD void cast_at(const void* src, int src_dt, void* dst, int dst_dt, std::int64_t i) {
  if (src_dt == dt_i32 && (dst_dt == dt_i8 || dst_dt == dt_u8)) {
    const std::int64_t v = static_cast<const std::int32_t*>(src)[i];
    if (dst_dt == dt_i8)
      static_cast<std::int8_t*>(dst)[i] = static_cast<std::int8_t>(v < -128 ? -128 : (v > 127 ? 127 : v));
    else
      static_cast<std::uint8_t*>(dst)[i] = static_cast<std::uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
    return;
  }
  store_from_f32(dst, dst_dt, i, load_as_f32(src, src_dt, i));
}

// ---- dropout: core::hash32 / core::dropout_keep ---------------------------------------------

CLEAVE_HD std::uint32_t hash32(std::uint32_t seed, std::uint32_t index) {
  std::uint32_t h = seed ^ 0x9e3779b9u;
  h ^= index + 0x7f4a7c15u + (h << 6) + (h >> 2);
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}

CLEAVE_HD bool dropout_keep(std::uint32_t seed, std::uint32_t index, std::uint32_t keep_threshold) {
  return hash32(seed, index) < keep_threshold;
}

// ---- the int8 cut codec: core::channel_absmax / quantize_int8 / decode_int8, one element -----

// |x|'s bits, or all ones where x is not finite: finite non-negative floats order as their bits,
// so the maximum of these keys over a channel is the key of its max |x| (all ones: NaN).
CLEAVE_HD std::uint32_t absmax_key(float x) {
  const std::uint32_t b = float_bits(x) & 0x7fffffffu;
  return b >= 0x7f800000u ? 0xffffffffu : b;
}
CLEAVE_HD float absmax_of_key(std::uint32_t key) {
  return bits_float(key == 0xffffffffu ? 0x7fc00000u : key);
}

// The code of x at flat index e of its tensor, inv its channel's inverse scale: each product and
// sum rounded on its own (no fused multiply-add), as the host computes it.
CLEAVE_HD std::int8_t quantize_one(float x, float inv, bool stochastic, std::uint32_t seed, std::uint32_t e) {
#if defined(__CUDA_ARCH__)
  const float v = __fmul_rn(x, inv);
  const float r =
      stochastic ? floorf(__fadd_rn(v, static_cast<float>(hash32(seed, e) >> 8) * (1.0f / 16777216.0f))) : rintf(v);
#else
  const float v = x * inv;
  const float r =
      stochastic ? std::floor(v + static_cast<float>(hash32(seed, e) >> 8) * (1.0f / 16777216.0f)) : std::nearbyint(v);
#endif
  if ((float_bits(r) & 0x7fffffffu) > 0x7f800000u) return 0;  // NaN
  return static_cast<std::int8_t>(r < -127.0f ? -127.0f : (r > 127.0f ? 127.0f : r));
}

// ---- pooling over one (H,W) plane -----------------------------------------------------------

struct pool_geom {
  std::int64_t h, w;    // input plane
  std::int64_t ph, pw;  // output plane
  int kh, kw, sh, sw, pad_h, pad_w;
};

// Max over the window of output (p,q): padding is skipped (counts as -inf); ties keep the
// first element in row-major window order. *at = ih*w + iw of the maximum, -1 if none.
CLEAVE_HD float max_pool_at(const float* plane, const pool_geom& g, std::int64_t p, std::int64_t q, std::int32_t* at) {
  float best = -INFINITY;
  std::int32_t best_at = -1;
  for (int r = 0; r < g.kh; ++r) {
    const std::int64_t ih = p * g.sh - g.pad_h + r;
    if (ih < 0 || ih >= g.h) continue;
    for (int s = 0; s < g.kw; ++s) {
      const std::int64_t iw = q * g.sw - g.pad_w + s;
      if (iw < 0 || iw >= g.w) continue;
      const float v = plane[ih * g.w + iw];
      if (best_at < 0 || v > best) {
        best = v;
        best_at = static_cast<std::int32_t>(ih * g.w + iw);
      }
    }
  }
  *at = best_at;
  return best;
}

// Average over the window, padding counted as zeros: sum / (kh * kw).
CLEAVE_HD float avg_pool_at(const float* plane, const pool_geom& g, std::int64_t p, std::int64_t q) {
  double sum = 0.0;
  for (int r = 0; r < g.kh; ++r) {
    const std::int64_t ih = p * g.sh - g.pad_h + r;
    if (ih < 0 || ih >= g.h) continue;
    for (int s = 0; s < g.kw; ++s) {
      const std::int64_t iw = q * g.sw - g.pad_w + s;
      if (iw >= 0 && iw < g.w) sum += plane[ih * g.w + iw];
    }
  }
  return static_cast<float>(sum / (static_cast<double>(g.kh) * g.kw));
}

// The outputs whose window covers input row `i` along one axis: [*lo, *hi] (empty if lo > hi).
CLEAVE_HD void covering_range(std::int64_t i, int kernel, int stride, int pad, std::int64_t n_out, std::int64_t* lo,
                              std::int64_t* hi) {
  // p covers i when p*stride - pad <= i <= p*stride - pad + kernel - 1.
  const std::int64_t top = i + pad;              // p*stride <= top
  const std::int64_t bottom = top - kernel + 1;  // p*stride >= bottom
  *lo = bottom <= 0 ? 0 : (bottom + stride - 1) / stride;
  const std::int64_t h = top / stride;
  *hi = h < n_out - 1 ? h : n_out - 1;
}

// Gradient of input (ih,iw) of a max pool: the sum of dy over the outputs whose argmax it is,
// in increasing output order (the order in which the reference scatters).
CLEAVE_HD float max_pool_grad_at(const float* dy_plane, const std::int32_t* idx_plane, const pool_geom& g,
                                 std::int64_t ih, std::int64_t iw) {
  std::int64_t p0, p1, q0, q1;
  covering_range(ih, g.kh, g.sh, g.pad_h, g.ph, &p0, &p1);
  covering_range(iw, g.kw, g.sw, g.pad_w, g.pw, &q0, &q1);
  const std::int32_t me = static_cast<std::int32_t>(ih * g.w + iw);
  float acc = 0.0f;
  for (std::int64_t p = p0; p <= p1; ++p)
    for (std::int64_t q = q0; q <= q1; ++q)
      if (idx_plane[p * g.pw + q] == me) acc += dy_plane[p * g.pw + q];
  return acc;
}

// Gradient of input (ih,iw) of an average pool: sum of dy * (1 / (kh*kw)) over covering outputs.
CLEAVE_HD float avg_pool_grad_at(const float* dy_plane, const pool_geom& g, std::int64_t ih, std::int64_t iw) {
  std::int64_t p0, p1, q0, q1;
  covering_range(ih, g.kh, g.sh, g.pad_h, g.ph, &p0, &p1);
  covering_range(iw, g.kw, g.sw, g.pad_w, g.pw, &q0, &q1);
  const float inv_area = 1.0f / static_cast<float>(g.kh * g.kw);
  float acc = 0.0f;
  for (std::int64_t p = p0; p <= p1; ++p)
    for (std::int64_t q = q0; q <= q1; ++q) acc += dy_plane[p * g.pw + q] * inv_area;
  return acc;
}

// ---- batch norm element formulas (the reference's, in double where it uses double) ----------

// y = gamma (x - mean) invstd + beta
CLEAVE_HD float bn_normalize(float x, float gamma, float beta, double mean, double invstd) {
  return static_cast<float>(gamma * (x - mean) * invstd + beta);
}

// dx = gamma invstd (dy - sum_dy / count - xhat sum_dy_xhat / count), xhat from the saved
// f32 statistics exactly as the reference computes it.
CLEAVE_HD float bn_grad_input(float x, float dy, float gamma, float mean, float invstd, double sum_dy,
                              double sum_dy_xhat, double count) {
  const double xhat = (x - mean) * static_cast<double>(invstd);
  return static_cast<float>(gamma * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count));
}

struct bn_stats {
  double mean, var, invstd, unbiased;
};

// Channel statistics from the shifted sums s1 = sum (x - x0), s2 = sum (x - x0)^2 over `count`
// values (the shift by one of the values keeps the one-pass variance accurate).
CLEAVE_HD bn_stats bn_finalize(double s1, double s2, double x0, double count, float eps) {
  const double shift_mean = s1 / count;
  double var = s2 / count - shift_mean * shift_mean;
  if (var < 0.0) var = 0.0;
  return {x0 + shift_mean, var, 1.0 / sqrt(var + eps), count > 1 ? var * count / (count - 1) : var};
}

// running = (1 - momentum) running + momentum batch, in double as the reference.
CLEAVE_HD float bn_running(float running, float momentum, double batch) {
  return static_cast<float>((1.0 - momentum) * running + momentum * batch);
}

CLEAVE_HD double bn_xhat(float x, float mean, float invstd) {
  return (x - mean) * static_cast<double>(invstd);
}

// ---- optimizers -----------------------------------------------------------------------------

struct sgd_params {
  float lr, momentum, weight_decay;
  bool nesterov;
};

// One SGD step of one element; buf is null when momentum == 0.
CLEAVE_HD void sgd_step(float* p, float g, float* buf, const sgd_params& d) {
  float gi = g + d.weight_decay * *p;
  if (buf) {
    *buf = d.momentum * *buf + gi;
    gi = d.nesterov ? gi + d.momentum * *buf : *buf;
  }
  *p -= d.lr * gi;
}

struct adamw_params {
  float beta1, beta2, eps;
  float decay;      // 1 - lr * weight_decay
  float step_size;  // lr / (1 - beta1^step)
  float bc2_sqrt;   // sqrt(1 - beta2^step)
};

CLEAVE_HD void adamw_step(float* p, float g, float* m, float* v, const adamw_params& d) {
  *p *= d.decay;
  *m = d.beta1 * *m + (1.0f - d.beta1) * g;
  *v = d.beta2 * *v + (1.0f - d.beta2) * g * g;
  *p -= d.step_size * *m / (sqrtf(*v) / d.bc2_sqrt + d.eps);
}

}  // namespace cleave::backend::cuda_math
