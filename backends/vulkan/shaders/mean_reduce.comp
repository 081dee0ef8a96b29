// out[0] = sum(in[0..n)) / n, one workgroup.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "reduce.glsl"

layout(set = 0, binding = 0) readonly buffer I { float data[]; };
layout(set = 0, binding = 1) buffer O { float result[]; };

layout(push_constant) uniform PC {
  uint n;
  uint off_in, off_out;
} pc;

void main() {
  float s = 0.0;
  for (uint i = gl_LocalInvocationID.x; i < pc.n; i += WG) s += data[pc.off_in + i];
  const float total = workgroup_sum(s);
  if (gl_LocalInvocationID.x == 0) result[pc.off_out] = total / float(pc.n);
}
