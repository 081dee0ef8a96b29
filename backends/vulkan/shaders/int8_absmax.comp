// The int8 cut codec's first step (core::channel_absmax, bit for bit): amax[c] = max |x| over
// channel c of x (outer, channels, inner), NaN where the channel holds a non-finite value. Finite
// non-negative floats order as their bits, so the maximum is taken over |x|'s bits, with all ones
// standing for a non-finite value. One workgroup per channel (grid-stride over channels).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(set = 0, binding = 0) readonly buffer X { uint x[]; };
layout(set = 0, binding = 1) buffer A { uint amax[]; };

layout(push_constant) uniform PC {
  uint outer, channels, inner;
  uint off_x, off_a;  // in words
} pc;

shared uint red[WG];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint per = pc.outer * pc.inner;
  for (uint c = gl_WorkGroupID.x; c < pc.channels; c += gl_NumWorkGroups.x) {
    uint m = 0u;
    for (uint j = tid; j < per; j += WG) {
      const uint o = j / pc.inner, i = j - o * pc.inner;
      const uint bits = x[pc.off_x + (o * pc.channels + c) * pc.inner + i] & 0x7fffffffu;
      m = max(m, bits >= 0x7f800000u ? 0xffffffffu : bits);
    }
    red[tid] = m;
    barrier();
    for (uint h = WG / 2; h > 0; h >>= 1) {
      if (tid < h) red[tid] = max(red[tid], red[tid + h]);
      barrier();
    }
    if (tid == 0) amax[pc.off_a + c] = red[0] == 0xffffffffu ? 0x7fc00000u : red[0];
    barrier();
  }
}
