// Dense GEMM with strided operands: A(i,p) = a[off_a + i e0 + p e1], B(p,j) = b[off_b + p e2 + j e3]
// (transposes are strides), C as in gemm_common.glsl.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "gemm_common.glsl"

layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) readonly buffer B { float b[]; };

float load_a(uint i, uint p, uint ii, uint pp) {
  return a[pc.off_a + i * pc.e[0] + p * pc.e[1]];
}

float load_b(uint p, uint j, uint pp, uint jj) {
  return b[pc.off_b + p * pc.e[2] + j * pc.e[3]];
}

#include "gemm_core.glsl"
