// Grouped (and depthwise) convolution backward weights, one invocation per weight element:
// dw[k,j,r,s] += sum over (n, p, q) of dy[n,k,p,q] x[n, group(k) * C/G + j, window].
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "gconv_common.glsl"

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer DY { float dy[]; };
layout(set = 0, binding = 2) buffer DW { float dw[]; };

void main() {
  const uint cg = pc.C / pc.G, kg = pc.K / pc.G, rs = pc.R * pc.S, pq = pc.P * pc.Q;
  const uint total = pc.K * cg * rs;
  for (uint o = gl_GlobalInvocationID.x; o < total; o += grid_stride()) {
    const uint k = o / (cg * rs), j = (o / rs) % cg, r = (o % rs) / pc.S, s = o % pc.S;
    const uint ch = k / kg * cg + j;
    float acc = 0.0;
    for (uint n = 0; n < pc.N; ++n) {
      const uint xplane = pc.off0 + (n * pc.C + ch) * pc.H * pc.W;
      const uint dyplane = pc.off1 + (n * pc.K + k) * pq;
      for (uint p = 0; p < pc.P; ++p) {
        const int ih = int(p * pc.sh + r) - int(pc.ph);
        if (ih < 0 || ih >= int(pc.H)) continue;
        for (uint q = 0; q < pc.Q; ++q) {
          const int iw = int(q * pc.sw + s) - int(pc.pw);
          if (iw < 0 || iw >= int(pc.W)) continue;
          acc += dy[dyplane + p * pc.Q + q] * x[xplane + uint(ih) * pc.W + uint(iw)];
        }
      }
    }
    dw[pc.off2 + o] += acc;
  }
}
