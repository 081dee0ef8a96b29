// Convolution forward as implicit GEMM: y(K, N*P*Q) = w(K, C*R*S) im2col(x)(C*R*S, N*P*Q) + b.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "gemm_common.glsl"

layout(set = 0, binding = 0) readonly buffer W { float w[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
#define CONV_X x
#define CONV_X_OFF pc.off_b
#include "conv_common.glsl"

float load_a(uint k, uint p) {
  return w[pc.off_a + k * pc.Kd + p];
}

float load_b(uint p, uint j) {
  const uint rs = CR * CS, pq = CP * CQ;
  const uint ch = p / rs, r = (p % rs) / CS, s = p % CS;
  const uint n = j / pq, oh = (j % pq) / CQ, ow = j % CQ;
  return load_x_window(n, ch, oh, ow, r, s);
}

#include "gemm_core.glsl"
