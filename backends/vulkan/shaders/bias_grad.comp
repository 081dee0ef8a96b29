// Bias gradient: db[k] += sum over o < outer, x < inner of dy[(o * K + k) * inner + x]
// (linear: dy (N,K), inner 1; convolution: dy (N,K,P,Q), inner P*Q). One workgroup per k.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(set = 0, binding = 0) readonly buffer DY { float dy[]; };
layout(set = 0, binding = 1) buffer DB { float db[]; };

layout(push_constant) uniform PC {
  uint outer, K, inner;
  uint off_dy, off_db;
} pc;

shared float partial[WG];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint total = pc.outer * pc.inner;
  for (uint k = gl_WorkGroupID.x; k < pc.K; k += gl_NumWorkGroups.x) {
    float s = 0.0;
    for (uint t = tid; t < total; t += WG) s += dy[pc.off_dy + ((t / pc.inner) * pc.K + k) * pc.inner + t % pc.inner];
    partial[tid] = s;
    barrier();
    for (uint h = WG / 2; h > 0; h >>= 1) {
      if (tid < h) partial[tid] += partial[tid + h];
      barrier();
    }
    if (tid == 0) db[pc.off_db + k] += partial[0];
    barrier();
  }
}
