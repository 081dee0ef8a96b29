// Dropout forward: mask = hash32(seed, i) < threshold ? keep_scale : 0; y = x * mask. hash32 is
// core::hash32 (cleave/core/random.h) in 32-bit integer arithmetic, so the mask matches the
// host's bit for bit.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) buffer Y { float y[]; };
layout(set = 0, binding = 2) buffer M { float mask[]; };

layout(push_constant) uniform PC {
  uint n;
  uint off_x, off_y, off_m;
  uint seed, threshold;
  float keep_scale;
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

void main() {
  for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += grid_stride()) {
    const float m = hash32(pc.seed, i) < pc.threshold ? pc.keep_scale : 0.0;
    precise float v = x[pc.off_x + i] * m;
    mask[pc.off_m + i] = m;
    y[pc.off_y + i] = v;
  }
}
