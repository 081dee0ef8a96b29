// Element-wise f32 ops selected by a specialization constant:
// 0 add y = a + b, 1 mul y = a * b, 2 axpy y += alpha a, 3 scale y *= alpha,
// 4 relu y = a > 0 ? a : 0, 5 relu backward y = a > 0 ? b : 0 (a = forward output, b = dy),
// 6 fill y = alpha, 7 clamp y = min(max(a, alpha), beta) (NaN stays NaN), 8 clamp backward
// y = alpha < a < beta ? b : 0 (a = forward output, b = dy). y may alias a or b: each element is read before it is written.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(constant_id = 0) const uint OP = 0;

layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) readonly buffer B { float b[]; };
layout(set = 0, binding = 2) buffer Y { float y[]; };

layout(push_constant) uniform PC {
  uint n;
  uint off_a, off_b, off_y;
  float alpha, beta;
} pc;

void main() {
  for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += grid_stride()) {
    // precise: no fused multiply-add, so results match the host's rounding bit for bit.
    precise float r;
    if (OP == 0) {
      r = a[pc.off_a + i] + b[pc.off_b + i];
    } else if (OP == 1) {
      r = a[pc.off_a + i] * b[pc.off_b + i];
    } else if (OP == 2) {
      precise float t = pc.alpha * a[pc.off_a + i];
      r = y[pc.off_y + i] + t;
    } else if (OP == 3) {
      r = y[pc.off_y + i] * pc.alpha;
    } else if (OP == 4) {
      const float v = a[pc.off_a + i];
      r = v > 0.0 ? v : 0.0;
    } else if (OP == 5) {
      r = a[pc.off_a + i] > 0.0 ? b[pc.off_b + i] : 0.0;
    } else if (OP == 7) {
      const float v = a[pc.off_a + i];
      r = v < pc.alpha ? pc.alpha : (v > pc.beta ? pc.beta : v);
    } else if (OP == 8) {
      const float v = a[pc.off_a + i];
      r = v > pc.alpha && v < pc.beta ? b[pc.off_b + i] : 0.0;
    } else {
      r = pc.alpha;
    }
    y[pc.off_y + i] = r;
  }
}
