// Grouped (and depthwise) convolution backward data, one invocation per input element: dx[n,c,h,w]
// sums dy over the output channels of c's group whose windows cover (h, w) (gather form).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "gconv_common.glsl"

layout(set = 0, binding = 0) readonly buffer DY { float dy[]; };
layout(set = 0, binding = 1) readonly buffer Wt { float w[]; };
layout(set = 0, binding = 2) buffer DX { float dx[]; };

void main() {
  const uint cg = pc.C / pc.G, kg = pc.K / pc.G, hw = pc.H * pc.W, pq = pc.P * pc.Q;
  const uint total = pc.N * pc.C * hw;
  for (uint o = gl_GlobalInvocationID.x; o < total; o += grid_stride()) {
    const uint n = o / (pc.C * hw), ch = (o / hw) % pc.C, ih = (o % hw) / pc.W, iw = o % pc.W;
    const uint k0 = ch / cg * kg, j = ch % cg;
    float acc = 0.0;
    for (uint k = k0; k < k0 + kg; ++k) {
      const uint dyplane = pc.off0 + (n * pc.K + k) * pq;
      const uint wbase = pc.off1 + (k * cg + j) * pc.R * pc.S;
      for (uint r = 0; r < pc.R; ++r) {
        const int ph = int(ih + pc.ph) - int(r);
        if (ph < 0 || uint(ph) % pc.sh != 0u) continue;
        const uint p = uint(ph) / pc.sh;
        if (p >= pc.P) continue;
        for (uint s = 0; s < pc.S; ++s) {
          const int qw = int(iw + pc.pw) - int(s);
          if (qw < 0 || uint(qw) % pc.sw != 0u) continue;
          const uint q = uint(qw) / pc.sw;
          if (q >= pc.Q) continue;
          acc += dy[dyplane + p * pc.Q + q] * w[wbase + r * pc.S + s];
        }
      }
    }
    dx[pc.off2 + o] = acc;
  }
}
