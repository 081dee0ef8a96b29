// The int8 cut codec's decoding (core::decode_int8, bit for bit): y[e] = q[e] * scales[c], c =
// (e / inner) % channels; q's bytes read from 32-bit words.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(set = 0, binding = 0) readonly buffer Q { uint q[]; };
layout(set = 0, binding = 1) readonly buffer S { float scales[]; };
layout(set = 0, binding = 2) buffer Y { float y[]; };

layout(push_constant) uniform PC {
  uint n, channels, inner;
  uint q_byte;             // byte offset of q's first element within its binding
  uint off_s, off_y;       // in words
} pc;

void main() {
  for (uint e = gl_GlobalInvocationID.x; e < pc.n; e += grid_stride()) {
    const uint byte = pc.q_byte + e;
    const int v = int(q[byte >> 2] << (24u - (byte & 3u) * 8u)) >> 24;
    precise float r = float(v) * scales[pc.off_s + (e / pc.inner) % pc.channels];
    y[pc.off_y + e] = r;
  }
}
