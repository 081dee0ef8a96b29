// The int8 cut codec's values (core::quantize_int8, bit for bit): q[e] = clamp(round_even(x[e] *
// inv[c]), -127, 127), 0 where that is NaN; stochastic: floor(x[e] * inv[c] + u) with u from
// hash32(seed, e) (core/random.h), e the flat index and c = (e / inner) % channels. Products and
// sums are `precise`: rounded one by one as the host rounds them. Each invocation owns one
// destination word, so the bytes are packed without races (bytes outside q are preserved).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer I { float inv[]; };
layout(set = 0, binding = 2) buffer Q { uint q[]; };

layout(push_constant) uniform PC {
  uint n, channels, inner;
  uint off_x, off_inv;        // in words
  uint q_byte;                // byte offset of q's first element within its binding
  uint first_word, n_words;   // destination words [first_word, first_word + n_words)
  uint stochastic, seed;
} pc;

uint hash32(uint seed, uint index) {
  uint h = seed ^ 0x9e3779b9u;
  h ^= index + 0x7f4a7c15u + (h << 6) + (h >> 2);
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}

uint quantize(uint e) {
  const uint c = (e / pc.inner) % pc.channels;
  precise float v = x[pc.off_x + e] * inv[pc.off_inv + c];
  float r;
  if (pc.stochastic != 0u) {
    const float u = float(hash32(pc.seed, e) >> 8) * (1.0 / 16777216.0);
    precise float s = v + u;
    r = floor(s);
  } else {
    r = roundEven(v);
  }
  if ((floatBitsToUint(r) & 0x7fffffffu) > 0x7f800000u) return 0u;  // NaN
  return uint(int(clamp(r, -127.0, 127.0))) & 0xffu;
}

void main() {
  const uint end_byte = pc.q_byte + pc.n;
  for (uint w = gl_GlobalInvocationID.x; w < pc.n_words; w += grid_stride()) {
    const uint word = pc.first_word + w;
    uint value = 0u, keep = 0u;
    for (uint lane = 0u; lane < 4u; ++lane) {
      const uint byte = word * 4u + lane;
      if (byte >= pc.q_byte && byte < end_byte)
        value |= quantize(byte - pc.q_byte) << (lane * 8u);
      else
        keep |= 0xffu << (lane * 8u);
    }
    q[word] = keep == 0u ? value : ((q[word] & keep) | value);
  }
}
