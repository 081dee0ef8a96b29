// Convolution forward as implicit GEMM: y(K, N*P*Q) = w(K, C*R*S) im2col(x)(C*R*S, N*P*Q) + b.
// Columns j = (n, oh, ow) keep x's offset of the window corner and its coordinates
// (oh * stride - pad, ow * stride - pad); rows p = (c, r, s) keep c*H*W + r*W + s, r and s.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "gemm_common.glsl"
#define GEMM_OUT_TABLE
#include "conv_common.glsl"

layout(set = 0, binding = 0) readonly buffer Wt { float w[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };

void prepare_columns(uint j0) {
  const uint pq = CP * CQ;
  for (uint jj = gl_LocalInvocationID.x; jj < BN; jj += 256) {
    const uint j = min(j0 + jj, pc.N - 1u);
    const uint n = j / pq, oh = (j % pq) / CQ, ow = j % CQ;
    const int ih0 = int(oh * STRIDE_H) - int(PAD_H), iw0 = int(ow * STRIDE_W) - int(PAD_W);
    col_u[jj] = ih0;
    col_v[jj] = iw0;
    col_base[jj] = int(n * CC * CH * CW) + ih0 * int(CW) + iw0;
    col_out[jj] = int(n * CK * pq + j % pq);
  }
}

void prepare_rows(uint k0) {
  const uint rs = CR * CS;
  for (uint pp = gl_LocalInvocationID.x; pp < BK; pp += 256) {
    const uint p = min(k0 + pp, pc.Kd - 1u);
    const uint ch = p / rs, r = (p % rs) / CS, s = p % CS;
    row_u[pp] = int(r);
    row_v[pp] = int(s);
    row_base[pp] = int((ch * CH + r) * CW + s);
  }
}

float load_a(uint k, uint p, uint ii, uint pp) {
  return w[pc.off_a + k * pc.Kd + p];
}

float load_b(uint p, uint j, uint pp, uint jj) {
  const int ih = col_u[jj] + row_u[pp], iw = col_v[jj] + row_v[pp];
  if (uint(ih) >= CH || uint(iw) >= CW) return 0.0;  // negative wraps to large
  return x[pc.off_b + uint(col_base[jj] + row_base[pp])];
}

#include "gemm_core.glsl"
