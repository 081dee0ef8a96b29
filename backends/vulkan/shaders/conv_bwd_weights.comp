// Convolution backward weights as implicit GEMM: dw(K, C*R*S) += dy(K, N*P*Q) im2col(x)^T(N*P*Q, C*R*S).
// The reduction runs over N*P*Q, usually long next to K x C*R*S: split-K spreads it over
// workgroups (see gemm_core.glsl). Rows p = (n, oh, ow) keep dy's offset n*K*P*Q + oh*Q + ow,
// x's offset of the window corner and its coordinates; columns j = (c, r, s) keep
// c*H*W + r*W + s, r and s.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "gemm_common.glsl"
#include "conv_common.glsl"

layout(set = 0, binding = 0) readonly buffer DY { float dy[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };

void prepare_columns(uint j0) {
  const uint rs = CR * CS;
  for (uint jj = gl_LocalInvocationID.x; jj < BN; jj += 256) {
    const uint j = min(j0 + jj, pc.N - 1u);
    const uint ch = j / rs, r = (j % rs) / CS, s = j % CS;
    col_base[jj] = int((ch * CH + r) * CW + s);
    col_u[jj] = int(r);
    col_v[jj] = int(s);
  }
}

void prepare_rows(uint k0) {
  const uint pq = CP * CQ;
  for (uint pp = gl_LocalInvocationID.x; pp < BK; pp += 256) {
    const uint p = min(k0 + pp, pc.Kd - 1u);
    const uint n = p / pq, oh = (p % pq) / CQ, ow = p % CQ;
    const int ih0 = int(oh * STRIDE_H) - int(PAD_H), iw0 = int(ow * STRIDE_W) - int(PAD_W);
    row_a[pp] = int(n * CK * pq + p % pq);
    row_u[pp] = ih0;
    row_v[pp] = iw0;
    row_base[pp] = int(n * CC * CH * CW) + ih0 * int(CW) + iw0;
  }
}

float load_a(uint k, uint p, uint ii, uint pp) {
  return dy[pc.off_a + uint(row_a[pp]) + k * CP * CQ];
}

float load_b(uint p, uint j, uint pp, uint jj) {
  const int ih = row_u[pp] + col_u[jj], iw = row_v[pp] + col_v[jj];
  if (uint(ih) >= CH || uint(iw) >= CW) return 0.0;
  return x[pc.off_b + uint(row_base[pp] + col_base[jj])];
}

#include "gemm_core.glsl"
