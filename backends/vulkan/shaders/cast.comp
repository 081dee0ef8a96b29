// dtype conversion, bit-exact with cleave/core/convert.h: float to integer rounds to nearest
// even and saturates (NaN -> 0); to f16 / bf16 rounds to nearest even. Buffers are read and
// written as 32-bit words; each invocation owns one destination word, so elements of 1 or 2
// bytes are packed without races (bytes of the word outside the tensor are preserved).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// dtype codes as core::dtype
#define T_F32 0u
#define T_F16 1u
#define T_BF16 2u
#define T_I8 3u
#define T_U8 4u
#define T_I32 5u

layout(set = 0, binding = 0) readonly buffer S { uint src[]; };
layout(set = 0, binding = 1) buffer D { uint dst[]; };

layout(push_constant) uniform PC {
  uint n;                    // elements
  uint src_byte, dst_byte;   // byte offsets of the first element within the bindings
  uint src_type, dst_type;
  uint first_word, n_words;  // destination words [first_word, first_word + n_words)
} pc;

uint type_size(uint t) {
  return (t == T_F32 || t == T_I32) ? 4u : ((t == T_F16 || t == T_BF16) ? 2u : 1u);
}

// Raw bits of element e of the source (zero-extended to 32 bits).
uint load_bits(uint e) {
  const uint sz = type_size(pc.src_type);
  const uint byte = pc.src_byte + e * sz;
  const uint word = src[byte >> 2];
  const uint shift = (byte & 3u) * 8u;
  if (sz == 4u) return word;
  if (sz == 2u) return (word >> shift) & 0xffffu;
  return (word >> shift) & 0xffu;
}

uint f16_to_f32_bits(uint h) {
  const uint sign = (h & 0x8000u) << 16;
  const uint e = (h >> 10) & 0x1fu;
  const uint mant = h & 0x3ffu;
  if (e == 0u) {
    // Subnormal or zero: mant * 2^-24, exact in f32.
    const float v = float(mant) * 5.9604644775390625e-8;
    return sign | floatBitsToUint(v);
  }
  if (e == 31u) return sign | 0x7f800000u | (mant << 13);
  return sign | ((e + 112u) << 23) | (mant << 13);
}

uint f32_bits_to_f16(uint x) {
  const uint sign = (x >> 16) & 0x8000u;
  const uint absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (absx >= 0x477ff000u) return sign | 0x7c00u;
  if (absx < 0x38800000u) {
    if (absx < 0x33000000u) return sign;
    const uint full = (absx & 0x7fffffu) | 0x800000u;
    const uint shift = 126u - (absx >> 23);
    uint result = full >> shift;
    const uint rem = full & ((1u << shift) - 1u);
    const uint halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (result & 1u) != 0u)) ++result;
    return sign | result;
  }
  uint h = (absx >> 13) - (112u << 10);
  const uint rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) ++h;
  return sign | h;
}

uint f32_bits_to_bf16(uint x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return ((x >> 16) | 0x40u) & 0xffffu;
  const uint rounding = 0x7fffu + ((x >> 16) & 1u);
  return ((x + rounding) >> 16) & 0xffffu;
}

// The source element as f32 bits (integers converted as static_cast<float> does).
uint to_f32_bits(uint bits) {
  switch (pc.src_type) {
    case T_F32:
      return bits;
    case T_F16:
      return f16_to_f32_bits(bits);
    case T_BF16:
      return bits << 16;
    case T_I8:
      return floatBitsToUint(float(int(bits << 24) >> 24));
    case T_U8:
      return floatBitsToUint(float(bits));
    default:
      return floatBitsToUint(float(int(bits)));
  }
}

int f32_to_int_sat(uint bits, int lo, int hi) {
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0;  // NaN
  const float r = roundEven(uintBitsToFloat(bits));
  if (r <= float(lo)) return lo;
  if (r >= float(hi)) return hi;
  return int(r);
}

// Destination bits of element e (only the low type_size bytes are meaningful).
uint convert(uint e) {
  const uint bits = load_bits(e);
  if (pc.src_type == T_I32 && (pc.dst_type == T_I8 || pc.dst_type == T_U8)) {
    // Integer to integer saturates without a trip through float (exact for all i32).
    const int v = int(bits);
    return uint(pc.dst_type == T_I8 ? clamp(v, -128, 127) : clamp(v, 0, 255));
  }
  const uint f = to_f32_bits(bits);
  switch (pc.dst_type) {
    case T_F32:
      return f;
    case T_F16:
      return f32_bits_to_f16(f);
    case T_BF16:
      return f32_bits_to_bf16(f);
    case T_I8:
      return uint(f32_to_int_sat(f, -128, 127));
    case T_U8:
      return uint(f32_to_int_sat(f, 0, 255));
    default:
      return uint(f32_to_int_sat(f, -2147483647 - 1, 2147483647));
  }
}

void main() {
  const uint sz = type_size(pc.dst_type);
  const uint end_byte = pc.dst_byte + pc.n * sz;
  for (uint w = gl_GlobalInvocationID.x; w < pc.n_words; w += grid_stride()) {
    const uint word = pc.first_word + w;
    uint value = 0u, keep = 0u;
    for (uint lane = 0u; lane < 4u; lane += sz) {
      const uint byte = word * 4u + lane;
      const uint lane_mask = sz == 4u ? 0xffffffffu : (((1u << (sz * 8u)) - 1u) << (lane * 8u));
      if (byte >= pc.dst_byte && byte < end_byte) {
        const uint e = (byte - pc.dst_byte) / sz;
        value |= (convert(e) << (lane * 8u)) & lane_mask;
      } else {
        keep |= lane_mask;
      }
    }
    dst[word] = keep == 0u ? value : ((dst[word] & keep) | value);
  }
}
