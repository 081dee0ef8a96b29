// Grouped (and depthwise) convolution forward, one invocation per output element:
// y[n,k,p,q] = b[k] + sum over the C/G channels of k's group and the R x S window.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "gconv_common.glsl"

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer Wt { float w[]; };
layout(set = 0, binding = 2) buffer Y { float y[]; };
layout(set = 0, binding = 3) readonly buffer B { float b[]; };

void main() {
  const uint cg = pc.C / pc.G, kg = pc.K / pc.G, pq = pc.P * pc.Q;
  const uint total = pc.N * pc.K * pq;
  for (uint o = gl_GlobalInvocationID.x; o < total; o += grid_stride()) {
    const uint n = o / (pc.K * pq), k = (o / pq) % pc.K, p = (o % pq) / pc.Q, q = o % pc.Q;
    const uint c0 = k / kg * cg;
    float acc = pc.has_bias != 0u ? b[pc.off_b + k] : 0.0;
    for (uint j = 0; j < cg; ++j) {
      const uint xplane = pc.off0 + ((n * pc.C + c0 + j) * pc.H) * pc.W;
      const uint wbase = pc.off1 + (k * cg + j) * pc.R * pc.S;
      for (uint r = 0; r < pc.R; ++r) {
        const int ih = int(p * pc.sh + r) - int(pc.ph);
        if (ih < 0 || ih >= int(pc.H)) continue;
        for (uint s = 0; s < pc.S; ++s) {
          const int iw = int(q * pc.sw + s) - int(pc.pw);
          if (iw < 0 || iw >= int(pc.W)) continue;
          acc += x[xplane + uint(ih) * pc.W + uint(iw)] * w[wbase + r * pc.S + s];
        }
      }
    }
    y[pc.off2 + o] = acc;
  }
}
