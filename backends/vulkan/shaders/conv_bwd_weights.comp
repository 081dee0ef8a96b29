// Convolution backward weights as implicit GEMM: dw(K, C*R*S) += dy(K, N*P*Q) im2col(x)^T(N*P*Q, C*R*S).
// The reduction runs over N*P*Q, usually long next to K x C*R*S: split-K spreads it over
// workgroups (see gemm_core.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "gemm_common.glsl"

layout(set = 0, binding = 0) readonly buffer DY { float dy[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
#define CONV_X x
#define CONV_X_OFF pc.off_b
#include "conv_common.glsl"

float load_a(uint k, uint p) {
  const uint pq = CP * CQ;
  return dy[pc.off_a + ((p / pq) * CK + k) * pq + p % pq];
}

float load_b(uint p, uint j) {
  const uint rs = CR * CS, pq = CP * CQ;
  const uint n = p / pq, oh = (p % pq) / CQ, ow = p % CQ;
  const uint ch = j / rs, r = (j % rs) / CS, s = j % CS;
  return load_x_window(n, ch, oh, ow, r, s);
}

#include "gemm_core.glsl"
