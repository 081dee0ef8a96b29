// Scalar conversions between f32 and the storage types (f16, bf16, integers), bit-exact and
// identical on every host backend.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace cleave::core {

// f32 -> IEEE half, round to nearest even; overflow gives inf, NaN stays NaN.
inline std::uint16_t f32_to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<std::uint16_t>(sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  if (absx < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (absx < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25 rounds to 0
    // Subnormal half: value * 2^24 = full >> (126 - exponent), shift in 14..24.
    const std::uint32_t full = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - (absx >> 23);
    std::uint32_t result = full >> shift;
    const std::uint32_t rem = full & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
    return static_cast<std::uint16_t>(sign | result);
  }
  std::uint32_t h = ((absx >> 13) - (112u << 10));  // rebias exponent 127 -> 15
  const std::uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

// f32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN.
inline std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

inline float bf16_to_f32(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// f32 -> integer in [lo, hi]: round to nearest even, saturate, NaN -> 0.
inline std::int64_t f32_to_int_sat(float f, std::int64_t lo, std::int64_t hi) {
  if (std::isnan(f)) return 0;
  const double r = std::nearbyint(static_cast<double>(f));  // default mode: to nearest even
  if (r <= static_cast<double>(lo)) return lo;
  if (r >= static_cast<double>(hi)) return hi;
  return static_cast<std::int64_t>(r);
}

}  // namespace cleave::core
