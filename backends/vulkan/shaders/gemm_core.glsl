// Tiled GEMM main loop: C(M,N) = A(M,Kd) B(Kd,N), one BM x BN tile per workgroup of 256
// invocations, each computing TM x TN outputs from BK-deep slices staged in shared memory.
// The including shader defines load_a(i, p, ii, pp) and load_b(p, j, pp, jj) (global and
// in-tile indices, called in range only), which may gather from images (implicit-GEMM
// convolution). With GEMM_TABLES defined it also defines prepare_columns(j0), run once, and
// prepare_rows(k0), run before each BK-deep slice: they decode the tile's columns and the
// slice's rows into shared tables, so the loads need no integer division. With GEMM_OUT_TABLE
// prepare_columns also fills col_out[jj], the column part of C's index (gemm_common.glsl);
// without it C is a plain row-major matrix. Workgroup z is the split-K index: with
// n_split > 1 each split writes its partial sums to c[off_c + (z * M + i) * N + j] and splitk_reduce
// applies the epilogue.
layout(local_size_x = 256) in;

#ifndef GEMM_TABLES
layout(constant_id = 0) const uint BM = 64;
layout(constant_id = 1) const uint BN = 64;
const uint BK = 16;
#endif
layout(constant_id = 2) const uint TM = 4;
layout(constant_id = 3) const uint TN = 4;
layout(constant_id = 4) const bool A_P_FAST = true;  // A(i,p) and A(i,p+1) are adjacent in memory
layout(constant_id = 5) const bool B_J_FAST = true;  // B(p,j) and B(p,j+1) are adjacent in memory
const uint AS = BM + 1;  // padded rows: column-wise stores hit distinct banks
const uint BS = BN + 1;

shared float As[BK * AS];
shared float Bs[BK * BS];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint TX = BN / TN;
  const uint TY = BM / TM;
  const uint tx = tid % TX, ty = tid / TX;
  const uint i0 = gl_WorkGroupID.y * BM;
  const uint j0 = (gl_WorkGroupID.x + pc.tile_j0) * BN;
  const uint kbeg = gl_WorkGroupID.z * pc.k_per_split;
  const uint kend = min(pc.Kd, kbeg + pc.k_per_split);

  float acc[TM * TN];
  for (uint t = 0; t < TM * TN; ++t) acc[t] = 0.0;

#ifdef GEMM_TABLES
  prepare_columns(j0);
#endif
  for (uint k0 = kbeg; k0 < kend; k0 += BK) {
#ifdef GEMM_TABLES
    prepare_rows(k0);
    barrier();
#endif
    for (uint e = tid; e < BM * BK; e += 256) {
      uint ii, pp;
      if (A_P_FAST) {
        ii = e / BK;
        pp = e % BK;
      } else {
        pp = e / BM;
        ii = e % BM;
      }
      const uint gi = i0 + ii, gp = k0 + pp;
      As[pp * AS + ii] = (gi < pc.M && gp < kend) ? load_a(gi, gp, ii, pp) : 0.0;
    }
    for (uint e = tid; e < BK * BN; e += 256) {
      uint jj, pp;
      if (B_J_FAST) {
        pp = e / BN;
        jj = e % BN;
      } else {
        jj = e / BK;
        pp = e % BK;
      }
      const uint gj = j0 + jj, gp = k0 + pp;
      Bs[pp * BS + jj] = (gj < pc.N && gp < kend) ? load_b(gp, gj, pp, jj) : 0.0;
    }
    barrier();
    for (uint p = 0; p < BK; ++p) {
      float a[TM];
      float b[TN];
      for (uint m = 0; m < TM; ++m) a[m] = As[p * AS + ty + m * TY];
      for (uint n = 0; n < TN; ++n) b[n] = Bs[p * BS + tx + n * TX];
      for (uint m = 0; m < TM; ++m)
        for (uint n = 0; n < TN; ++n) acc[m * TN + n] += a[m] * b[n];
    }
    barrier();
  }

  for (uint m = 0; m < TM; ++m) {
    const uint i = i0 + ty + m * TY;
    if (i >= pc.M) continue;
    for (uint n = 0; n < TN; ++n) {
      const uint j = j0 + tx + n * TX;
      if (j >= pc.N) continue;
      if (pc.n_split > 1u) {
        c[pc.off_c + (gl_WorkGroupID.z * pc.M + i) * pc.N + j] = acc[m * TN + n];
      } else {
#ifdef GEMM_OUT_TABLE
        const uint col = uint(col_out[tx + n * TX]);
#else
        const uint col = j;  // plain row-major C: c_grp == N
#endif
        store_output(i, j, col, acc[m * TN + n]);
      }
    }
  }
}
