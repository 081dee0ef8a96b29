// AdamW update as PyTorch (decoupled weight decay); the bias corrections are computed on the
// host as the reference does: p *= decay; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= step_size m / (sqrt(v) / bc2_sqrt + eps).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(set = 0, binding = 0) buffer P { float param[]; };
layout(set = 0, binding = 1) readonly buffer G { float grad[]; };
layout(set = 0, binding = 2) buffer M { float m[]; };
layout(set = 0, binding = 3) buffer V { float v[]; };

layout(push_constant) uniform PC {
  uint n;
  uint off_p, off_g, off_m, off_v;
  float decay, beta1, beta2, step_size, bc2_sqrt, eps;
} pc;

void main() {
  for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += grid_stride()) {
    const float g = grad[pc.off_g + i];
    precise float p = param[pc.off_p + i] * pc.decay;
    precise float m1 = pc.beta1 * m[pc.off_m + i];
    precise float m2 = (1.0 - pc.beta1) * g;
    precise float mn = m1 + m2;
    precise float v1 = pc.beta2 * v[pc.off_v + i];
    precise float v2 = (1.0 - pc.beta2) * g;
    precise float v3 = v2 * g;
    precise float vn = v1 + v3;
    precise float denom = sqrt(vn) / pc.bc2_sqrt + pc.eps;
    precise float upd = pc.step_size * mn;
    precise float np = p - upd / denom;
    m[pc.off_m + i] = mn;
    v[pc.off_v + i] = vn;
    param[pc.off_p + i] = np;
  }
}
