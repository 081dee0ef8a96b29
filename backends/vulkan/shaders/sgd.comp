// SGD update as PyTorch (dampening 0): g = grad + wd p; buf = momentum buf + g;
// g = nesterov ? g + momentum buf : buf; p -= lr g. Without momentum buf is not touched.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(set = 0, binding = 0) buffer P { float param[]; };
layout(set = 0, binding = 1) readonly buffer G { float grad[]; };
layout(set = 0, binding = 2) buffer M { float buf[]; };

layout(push_constant) uniform PC {
  uint n;
  uint off_p, off_g, off_m;
  float lr, momentum, weight_decay;
  uint nesterov, has_momentum;
} pc;

void main() {
  for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += grid_stride()) {
    const float p = param[pc.off_p + i];
    precise float wdp = pc.weight_decay * p;
    precise float g = grad[pc.off_g + i] + wdp;
    if (pc.has_momentum != 0u) {
      precise float mb = pc.momentum * buf[pc.off_m + i];
      precise float b = mb + g;
      buf[pc.off_m + i] = b;
      if (pc.nesterov != 0u) {
        precise float mb2 = pc.momentum * b;
        g = g + mb2;
      } else {
        g = b;
      }
    }
    precise float step = pc.lr * g;
    precise float np = p - step;
    param[pc.off_p + i] = np;
  }
}
