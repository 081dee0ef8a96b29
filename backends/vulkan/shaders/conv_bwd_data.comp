// Convolution backward data as implicit GEMM: dx(C, N*H*W) = w^T(C, K*R*S) gather(dy)(K*R*S, N*H*W),
// where gather picks dy(n, k, (h + pad - r) / stride, (w + pad - s) / stride) when that divides
// exactly and lies inside dy, else 0. Strides are specialization constants (6, 7) so the
// divisions compile to shifts or multiplies.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "gemm_common.glsl"
#define GEMM_OUT_TABLE
#include "conv_common.glsl"

layout(constant_id = 6) const uint SH = 1;
layout(constant_id = 7) const uint SW = 1;

layout(set = 0, binding = 0) readonly buffer Wt { float w[]; };
layout(set = 0, binding = 1) readonly buffer DY { float dy[]; };

// Columns j = (n, ih, iw): dy's image offset n*K*P*Q, ih + pad_h, iw + pad_w, and dx's index.
void prepare_columns(uint j0) {
  const uint hw = CH * CW;
  for (uint jj = gl_LocalInvocationID.x; jj < BN; jj += 256) {
    const uint j = min(j0 + jj, pc.N - 1u);
    const uint n = j / hw, ih = (j % hw) / CW, iw = j % CW;
    col_base[jj] = int(n * CK * CP * CQ);
    col_u[jj] = int(ih + PAD_H);
    col_v[jj] = int(iw + PAD_W);
    col_out[jj] = int(n * CC * hw + j % hw);
  }
}

// Rows p = (k, r, s): dy's channel offset k*P*Q, r, s; and w's offset k*C*R*S + r*S + s.
void prepare_rows(uint k0) {
  const uint rs = CR * CS;
  for (uint pp = gl_LocalInvocationID.x; pp < BK; pp += 256) {
    const uint p = min(k0 + pp, pc.Kd - 1u);
    const uint k = p / rs, r = (p % rs) / CS, s = p % CS;
    row_base[pp] = int(k * CP * CQ);
    row_u[pp] = int(r);
    row_v[pp] = int(s);
    row_a[pp] = int(k * CC * rs + p % rs);
  }
}

float load_a(uint ch, uint p, uint ii, uint pp) {
  return w[pc.off_a + uint(row_a[pp]) + ch * CR * CS];
}

float load_b(uint p, uint j, uint pp, uint jj) {
  const int th = col_u[jj] - row_u[pp], tw = col_v[jj] - row_v[pp];
  if (th < 0 || tw < 0) return 0.0;
  if (uint(th) % SH != 0u || uint(tw) % SW != 0u) return 0.0;
  const uint oh = uint(th) / SH, ow = uint(tw) / SW;
  if (oh >= CP || ow >= CQ) return 0.0;
  return dy[pc.off_b + uint(col_base[jj] + row_base[pp]) + oh * CQ + ow];
}

#include "gemm_core.glsl"
