// Batch norm backward, one workgroup per channel: with xhat = (x - mean) invstd,
// dx = gamma invstd (dy - mean(dy) - xhat mean(dy xhat)) (overwrite),
// dgamma += sum dy xhat, dbeta += sum dy.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "reduce.glsl"

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer DY { float dy[]; };
layout(set = 0, binding = 2) readonly buffer G { float gamma[]; };
layout(set = 0, binding = 3) readonly buffer SM { float save_mean[]; };
layout(set = 0, binding = 4) readonly buffer SI { float save_invstd[]; };
layout(set = 0, binding = 5) buffer DX { float dx[]; };
layout(set = 0, binding = 6) buffer DG { float dgamma[]; };
layout(set = 0, binding = 7) buffer DB { float dbeta[]; };

layout(push_constant) uniform PC {
  uint N, C, HW;
  uint off_x, off_dy, off_g, off_sm, off_si, off_dx, off_dg, off_db;
} pc;

uint at(uint ch, uint t) {
  return ((t / pc.HW) * pc.C + ch) * pc.HW + t % pc.HW;
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint count = pc.N * pc.HW;
  for (uint ch = gl_WorkGroupID.x; ch < pc.C; ch += gl_NumWorkGroups.x) {
    const float mean = save_mean[pc.off_sm + ch], invstd = save_invstd[pc.off_si + ch];
    float s_dy = 0.0, s_dyx = 0.0;
    for (uint t = tid; t < count; t += WG) {
      const uint i = at(ch, t);
      const float g = dy[pc.off_dy + i];
      s_dy += g;
      s_dyx += g * ((x[pc.off_x + i] - mean) * invstd);
    }
    const float sum_dy = workgroup_sum(s_dy);
    const float sum_dyx = workgroup_sum(s_dyx);
    const float m_dy = sum_dy / float(count), m_dyx = sum_dyx / float(count);
    const float k = gamma[pc.off_g + ch] * invstd;
    for (uint t = tid; t < count; t += WG) {
      const uint i = at(ch, t);
      const float xhat = (x[pc.off_x + i] - mean) * invstd;
      dx[pc.off_dx + i] = k * (dy[pc.off_dy + i] - m_dy - xhat * m_dyx);
    }
    if (tid == 0) {
      dgamma[pc.off_dg + ch] += sum_dyx;
      dbeta[pc.off_db + ch] += sum_dy;
    }
  }
}
