// dlogits = (probs - onehot(label)) * s, s = scale / N (computed on the host).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(set = 0, binding = 0) readonly buffer P { float probs[]; };
layout(set = 0, binding = 1) readonly buffer Lab { int labels[]; };
layout(set = 0, binding = 2) buffer D { float dlogits[]; };

layout(push_constant) uniform PC {
  uint N, K;
  uint off_p, off_lab, off_d;
  float s;
} pc;

void main() {
  const uint total = pc.N * pc.K;
  for (uint i = gl_GlobalInvocationID.x; i < total; i += grid_stride()) {
    const uint n = i / pc.K, j = i % pc.K;
    const float onehot = labels[pc.off_lab + n] == int(j) ? 1.0 : 0.0;
    precise float d = probs[pc.off_p + i] - onehot;
    precise float v = d * pc.s;
    dlogits[pc.off_d + i] = v;
  }
}
