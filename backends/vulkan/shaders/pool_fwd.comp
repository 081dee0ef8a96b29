// 2-D pooling forward, one invocation per output. max: padding counts as -inf, ties go to the
// first element in row-major window order, ws receives the argmax as ih * W + iw (-1 when the
// window holds no input). avg: sum / (kh * kw), padding counted as zeros.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "pool_common.glsl"

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) buffer Y { float y[]; };
layout(set = 0, binding = 2) buffer WS { int ws[]; };

void main() {
  const uint pq = pc.P * pc.Q;
  const uint total = pc.n_planes * pq;
  for (uint o = gl_GlobalInvocationID.x; o < total; o += grid_stride()) {
    const uint plane = o / pq, p = (o % pq) / pc.Q, q = o % pc.Q;
    float best = uintBitsToFloat(0xff800000u);  // -inf
    int best_at = -1;
    float sum = 0.0;
    for (uint r = 0; r < pc.kh; ++r) {
      const int ih = int(p * pc.sh + r) - int(pc.ph);
      if (ih < 0 || ih >= int(pc.H)) continue;
      for (uint s = 0; s < pc.kw; ++s) {
        const int iw = int(q * pc.sw + s) - int(pc.pw);
        if (iw < 0 || iw >= int(pc.W)) continue;
        const float v = x[pc.off_x + (plane * pc.H + uint(ih)) * pc.W + uint(iw)];
        if (best_at < 0 || v > best) {
          best = v;
          best_at = ih * int(pc.W) + iw;
        }
        sum += v;
      }
    }
    y[pc.off_y + o] = pc.is_max != 0u ? best : sum * pc.scale;
    if (pc.has_ws != 0u) ws[pc.off_ws + o] = best_at;
  }
}
