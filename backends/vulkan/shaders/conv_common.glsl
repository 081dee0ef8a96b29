// Convolution dimensions in the GEMM push constants' shader-specific words, and the shared
// tables the convolution shaders decode tile columns and slice rows into (see gemm_core.glsl).
#define CN pc.e[0]
#define CC pc.e[1]
#define CH pc.e[2]
#define CW pc.e[3]
#define CK pc.e[4]
#define CR pc.e[5]
#define CS pc.e[6]
#define CP pc.e[7]
#define CQ pc.e[8]
#define STRIDE_H pc.e[9]
#define STRIDE_W pc.e[10]
#define PAD_H pc.e[11]
#define PAD_W pc.e[12]
#define GEMM_TABLES

// Tile sizes as in gemm_core.glsl (declared here so the tables can use them).
layout(constant_id = 0) const uint BM = 64;
layout(constant_id = 1) const uint BN = 64;
const uint BK = 16;

// Per tile column (BN) and per slice row (BK): a base offset and two coordinates.
shared int col_base[BN];
shared int col_u[BN];
shared int col_v[BN];
shared int row_base[BK];
shared int row_u[BK];
shared int row_v[BK];
shared int row_a[BK];
shared int col_out[BN];
