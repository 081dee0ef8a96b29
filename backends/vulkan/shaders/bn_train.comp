// Batch norm forward (training), one workgroup per channel: batch mean and biased variance
// (two passes for accuracy), save_mean, save_invstd = 1 / sqrt(var + eps), running statistics
// (unbiased variance, times n / (n - 1)), and y = gamma (x - mean) invstd + beta.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "reduce.glsl"

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer G { float gamma[]; };
layout(set = 0, binding = 2) readonly buffer Bt { float beta[]; };
layout(set = 0, binding = 3) buffer Y { float y[]; };
layout(set = 0, binding = 4) buffer SM { float save_mean[]; };
layout(set = 0, binding = 5) buffer SI { float save_invstd[]; };
layout(set = 0, binding = 6) buffer RM { float running_mean[]; };
layout(set = 0, binding = 7) buffer RV { float running_var[]; };

layout(push_constant) uniform PC {
  uint N, C, HW;
  uint off_x, off_g, off_b, off_y, off_sm, off_si, off_rm, off_rv;
  float eps, momentum;
} pc;

uint at(uint ch, uint t) {
  return ((t / pc.HW) * pc.C + ch) * pc.HW + t % pc.HW;
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint count = pc.N * pc.HW;
  for (uint ch = gl_WorkGroupID.x; ch < pc.C; ch += gl_NumWorkGroups.x) {
    float s = 0.0;
    for (uint t = tid; t < count; t += WG) s += x[pc.off_x + at(ch, t)];
    const float mean = workgroup_sum(s) / float(count);
    float sq = 0.0;
    for (uint t = tid; t < count; t += WG) {
      const float d = x[pc.off_x + at(ch, t)] - mean;
      sq += d * d;
    }
    const float var = workgroup_sum(sq) / float(count);
    const float invstd = 1.0 / sqrt(var + pc.eps);
    const float g = gamma[pc.off_g + ch], b = beta[pc.off_b + ch];
    for (uint t = tid; t < count; t += WG) {
      const uint i = at(ch, t);
      y[pc.off_y + i] = g * (x[pc.off_x + i] - mean) * invstd + b;
    }
    if (tid == 0) {
      save_mean[pc.off_sm + ch] = mean;
      save_invstd[pc.off_si + ch] = invstd;
      const float unbiased = count > 1u ? var * float(count) / float(count - 1u) : var;
      running_mean[pc.off_rm + ch] = (1.0 - pc.momentum) * running_mean[pc.off_rm + ch] + pc.momentum * mean;
      running_var[pc.off_rv + ch] = (1.0 - pc.momentum) * running_var[pc.off_rv + ch] + pc.momentum * unbiased;
    }
  }
}
