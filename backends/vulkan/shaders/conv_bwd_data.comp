// Convolution backward data as implicit GEMM: dx(C, N*H*W) = w^T(C, K*R*S) gather(dy)(K*R*S, N*H*W),
// where gather picks dy(n, k, (h + pad - r) / stride, (w + pad - s) / stride) when that divides
// exactly and lies inside dy, else 0.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "gemm_common.glsl"

layout(set = 0, binding = 0) readonly buffer W { float w[]; };
layout(set = 0, binding = 1) readonly buffer DY { float dy[]; };
#include "conv_common.glsl"

float load_a(uint ch, uint p) {
  const uint rs = CR * CS;
  return w[pc.off_a + ((p / rs) * CC + ch) * rs + p % rs];
}

float load_b(uint p, uint j) {
  const uint rs = CR * CS, hw = CH * CW;
  const uint k = p / rs, r = (p % rs) / CS, s = p % CS;
  const uint n = j / hw, ih = (j % hw) / CW, iw = j % CW;
  const int th = int(ih + PAD_H) - int(r), tw = int(iw + PAD_W) - int(s);
  if (th < 0 || tw < 0) return 0.0;
  if (uint(th) % STRIDE_H != 0u || uint(tw) % STRIDE_W != 0u) return 0.0;
  const uint oh = uint(th) / STRIDE_H, ow = uint(tw) / STRIDE_W;
  if (oh >= CP || ow >= CQ) return 0.0;
  return dy[pc.off_b + ((n * CK + k) * CP + oh) * CQ + ow];
}

#include "gemm_core.glsl"
