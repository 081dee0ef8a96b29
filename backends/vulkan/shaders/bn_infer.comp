// Batch norm forward (inference): y = gamma (x - running_mean) / sqrt(running_var + eps) + beta.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer G { float gamma[]; };
layout(set = 0, binding = 2) readonly buffer Bt { float beta[]; };
layout(set = 0, binding = 3) readonly buffer RM { float running_mean[]; };
layout(set = 0, binding = 4) readonly buffer RV { float running_var[]; };
layout(set = 0, binding = 5) buffer Y { float y[]; };

layout(push_constant) uniform PC {
  uint total, C, HW;
  uint off_x, off_g, off_b, off_rm, off_rv, off_y;
  float eps;
} pc;

void main() {
  for (uint i = gl_GlobalInvocationID.x; i < pc.total; i += grid_stride()) {
    const uint ch = (i / pc.HW) % pc.C;
    const float invstd = 1.0 / sqrt(running_var[pc.off_rv + ch] + pc.eps);
    y[pc.off_y + i] = gamma[pc.off_g + ch] * (x[pc.off_x + i] - running_mean[pc.off_rm + ch]) * invstd +
                      beta[pc.off_b + ch];
  }
}
