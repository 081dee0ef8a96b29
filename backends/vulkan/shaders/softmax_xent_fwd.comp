// Softmax and per-row cross-entropy, one workgroup per row: probs = softmax(logits);
// row_loss[n] = -log probs[n, label] computed as -(logit - max - log sum). A label outside
// [0, K) gives a NaN loss rather than reading out of bounds.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "reduce.glsl"

layout(set = 0, binding = 0) readonly buffer L { float logits[]; };
layout(set = 0, binding = 1) readonly buffer Lab { int labels[]; };
layout(set = 0, binding = 2) buffer P { float probs[]; };
layout(set = 0, binding = 3) buffer RL { float row_loss[]; };

layout(push_constant) uniform PC {
  uint N, K;
  uint off_l, off_lab, off_p, off_rl;
} pc;

shared float red_max[WG];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  for (uint n = gl_WorkGroupID.x; n < pc.N; n += gl_NumWorkGroups.x) {
    const uint row = pc.off_l + n * pc.K;
    float m = uintBitsToFloat(0xff800000u);
    for (uint j = tid; j < pc.K; j += WG) m = max(m, logits[row + j]);
    red_max[tid] = m;
    barrier();
    for (uint h = WG / 2; h > 0; h >>= 1) {
      if (tid < h) red_max[tid] = max(red_max[tid], red_max[tid + h]);
      barrier();
    }
    const float mx = red_max[0];
    barrier();
    float s = 0.0;
    for (uint j = tid; j < pc.K; j += WG) s += exp(logits[row + j] - mx);
    const float sum = workgroup_sum(s);
    for (uint j = tid; j < pc.K; j += WG) probs[pc.off_p + n * pc.K + j] = exp(logits[row + j] - mx) / sum;
    if (tid == 0) {
      const int lab = labels[pc.off_lab + n];
      row_loss[pc.off_rl + n] =
          (lab >= 0 && lab < int(pc.K)) ? -(logits[row + uint(lab)] - mx - log(sum)) : uintBitsToFloat(0x7fc00000u);
    }
  }
}
