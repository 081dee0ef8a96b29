// The cut codecs on the host. Loops are written so that g++ vectorises them at -O3 (no
// branches in the conversions' hot loops beyond selects).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "cleave/core/codec.h"
#include "cleave/core/convert.h"
#include "cleave/core/error.h"
#include "cleave/core/random.h"

namespace cleave::core {

channel_layout channel_layout_of(const std::int64_t* dims, int rank) {
  channel_layout l;
  if (rank == 0) return l;
  l.outer = dims[0];
  if (rank == 1) return l;
  l.channels = dims[1];
  for (int i = 2; i < rank; ++i) l.inner *= dims[i];
  return l;
}

channel_layout channel_layout_of(const shape& s) {
  std::int64_t dims[shape::max_rank] = {};
  for (int i = 0; i < s.rank(); ++i) dims[i] = s[i];
  return channel_layout_of(dims, s.rank());
}

void encode_f16(const float* x, std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

void decode_f16(const std::uint16_t* in, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(in[i]);
}

void encode_bf16(const float* x, std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(x[i]);
}

void decode_bf16(const std::uint16_t* in, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(in[i]);
}

void channel_absmax(const float* x, const channel_layout& l, float* amax) {
  std::fill(amax, amax + l.channels, 0.0f);
  for (std::int64_t o = 0; o < l.outer; ++o)
    for (std::int64_t c = 0; c < l.channels; ++c) {
      const float* p = x + (o * l.channels + c) * l.inner;
      float m = amax[c];
      bool finite = true;
      for (std::int64_t i = 0; i < l.inner; ++i) {
        m = std::max(m, std::fabs(p[i]));
        finite &= std::isfinite(p[i]);
      }
      amax[c] = finite && !std::isnan(amax[c]) ? m : std::numeric_limits<float>::quiet_NaN();
    }
}

void int8_scales(const float* amax, std::int64_t channels, float* scales, float* inv) {
  for (std::int64_t c = 0; c < channels; ++c) {
    scales[c] = amax[c] / 127.0f;
    inv[c] = scales[c] > 0.0f ? 1.0f / scales[c] : 0.0f;  // NaN scale: the values decode to NaN anyway
  }
}

void quantize_int8(const float* x, const channel_layout& l, const float* inv, std::int8_t* q, bool stochastic,
                   std::uint32_t seed) {
  for (std::int64_t o = 0; o < l.outer; ++o)
    for (std::int64_t c = 0; c < l.channels; ++c) {
      const float s = inv[c];
      const std::int64_t base = (o * l.channels + c) * l.inner;
      const float* p = x + base;
      std::int8_t* out = q + base;
      if (!stochastic) {
        for (std::int64_t i = 0; i < l.inner; ++i) {
          const float v = std::clamp(std::nearbyint(p[i] * s), -127.0f, 127.0f);
          out[i] = static_cast<std::int8_t>(std::isnan(v) ? 0.0f : v);
        }
        continue;
      }
      for (std::int64_t i = 0; i < l.inner; ++i) {
        // floor(v + u), u uniform in [0, 1) from the tensor's seed and the value's position.
        const float u =
            static_cast<float>(hash32(seed, static_cast<std::uint32_t>(base + i)) >> 8) * (1.0f / 16777216.0f);
        const float v = std::clamp(std::floor(p[i] * s + u), -127.0f, 127.0f);
        out[i] = static_cast<std::int8_t>(std::isnan(v) ? 0.0f : v);
      }
    }
}

void encode_int8(const float* x, const channel_layout& l, std::int8_t* q, float* scales, bool stochastic,
                 std::uint32_t seed) {
  std::vector<float> amax(static_cast<std::size_t>(l.channels)), inv(amax.size());
  channel_absmax(x, l, amax.data());
  int8_scales(amax.data(), l.channels, scales, inv.data());
  quantize_int8(x, l, inv.data(), q, stochastic, seed);
}

void decode_int8(const std::int8_t* q, const float* scales, const channel_layout& l, float* y) {
  for (std::int64_t o = 0; o < l.outer; ++o)
    for (std::int64_t c = 0; c < l.channels; ++c) {
      const float s = scales[c];
      const std::int64_t base = (o * l.channels + c) * l.inner;
      for (std::int64_t i = 0; i < l.inner; ++i) y[base + i] = static_cast<float>(q[base + i]) * s;
    }
}

std::int64_t topk_count(std::int64_t n, float fraction) {
  if (n <= 0) return 0;
  // The fraction as the decimal it was written as (0.1f is 0.100000001...: 1000 values keep 100).
  const double kept = static_cast<double>(fraction) * static_cast<double>(n);
  const auto k = static_cast<std::int64_t>(std::ceil(kept - kept * 1e-6));
  return std::clamp<std::int64_t>(k, 1, n);
}

void encode_topk(const float* x, std::int64_t n, std::int64_t k, float* residual, float* values,
                 std::uint32_t* positions) {
  CLEAVE_ASSERT(k >= 0 && k <= n, "topk count out of range");
  if (n > static_cast<std::int64_t>(UINT32_MAX)) throw error("topk: a tensor of more than 2^32 values");
  std::vector<float> acc(x, x + n);
  if (residual)
    for (std::int64_t i = 0; i < n; ++i) acc[static_cast<std::size_t>(i)] += residual[i];
  std::vector<std::uint32_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0u);
  // Larger magnitude first; NaN counts as largest (it must reach the receiver); ties: lower position.
  auto key = [&](std::uint32_t i) {
    const float a = std::fabs(acc[i]);
    return std::isnan(a) ? std::numeric_limits<float>::infinity() : a;
  };
  auto before = [&](std::uint32_t a, std::uint32_t b) {
    const float ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && a < b);
  };
  if (k < n) std::nth_element(order.begin(), order.begin() + k, order.end(), before);
  std::sort(order.begin(), order.begin() + k);
  for (std::int64_t j = 0; j < k; ++j) {
    const std::uint32_t i = order[static_cast<std::size_t>(j)];
    positions[j] = i;
    values[j] = acc[i];
    acc[i] = 0.0f;
  }
  if (residual) std::copy(acc.begin(), acc.end(), residual);
}

void decode_topk(const float* values, const std::uint32_t* positions, std::int64_t k, float* y, std::int64_t n) {
  std::fill(y, y + n, 0.0f);
  for (std::int64_t j = 0; j < k; ++j) y[positions[j]] = values[j];
}

}  // namespace cleave::core
