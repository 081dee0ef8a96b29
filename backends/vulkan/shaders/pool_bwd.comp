// 2-D pooling backward as a gather, one invocation per input element: it sums the gradients of
// the windows that cover it in row-major window order (the order a scatter over the outputs
// would add them), so overlapping windows need no atomics. max uses the forward argmax in ws.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "pool_common.glsl"

layout(set = 0, binding = 0) readonly buffer DY { float dy[]; };
layout(set = 0, binding = 1) readonly buffer WS { int ws[]; };
layout(set = 0, binding = 2) buffer DX { float dx[]; };

void main() {
  const uint hw = pc.H * pc.W;
  const uint total = pc.n_planes * hw;
  for (uint t = gl_GlobalInvocationID.x; t < total; t += grid_stride()) {
    const uint plane = t / hw, ih = (t % hw) / pc.W, iw = t % pc.W;
    // Windows p with p * sh - ph <= ih <= p * sh - ph + kh - 1 (numerators kept non-negative:
    // integer division of negative values is not portable).
    const int top = int(ih + pc.ph), first_top = top - int(pc.kh) + 1;
    const int p_lo = first_top > 0 ? (first_top + int(pc.sh) - 1) / int(pc.sh) : 0;
    const int p_hi = min(int(pc.P) - 1, top / int(pc.sh));
    const int left = int(iw + pc.pw), first_left = left - int(pc.kw) + 1;
    const int q_lo = first_left > 0 ? (first_left + int(pc.sw) - 1) / int(pc.sw) : 0;
    const int q_hi = min(int(pc.Q) - 1, left / int(pc.sw));
    const int at = int(ih * pc.W + iw);
    float acc = 0.0;
    for (int p = p_lo; p <= p_hi; ++p) {
      for (int q = q_lo; q <= q_hi; ++q) {
        const uint o = (plane * pc.P + uint(p)) * pc.Q + uint(q);
        if (pc.is_max != 0u) {
          if (ws[pc.off_ws + o] == at) acc += dy[pc.off_y + o];
        } else {
          precise float g = dy[pc.off_y + o] * pc.scale;
          acc += g;
        }
      }
    }
    dx[pc.off_dx + t] = acc;
  }
}
