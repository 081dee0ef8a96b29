// Push constants and output epilogue shared by the GEMM-shaped shaders (gemm, conv_*, and
// splitk_reduce). C(i,j) for i < M, j < N lives at
//   off_c + i * c_rs + (j / c_grp) * c_gs + (j % c_grp)
// which covers a plain row-major matrix (c_rs = c_grp = N, c_gs = 0) and NCHW images whose
// columns run over (n, spatial) (c_rs = c_grp = spatial size, c_gs = channels * spatial size).
layout(push_constant) uniform PC {
  uint M, N, Kd;
  uint off_a, off_b, off_c, off_bias;
  uint k_per_split, n_split, tile_j0;
  float alpha, beta;
  uint bias_mode;  // 0 none, 1 bias[i], 2 bias[j]
  uint c_rs, c_grp, c_gs;
  uint e[13];  // shader-specific: strides of a plain GEMM, or the convolution's dimensions
} pc;

layout(set = 0, binding = 2) buffer C { float c[]; };
layout(set = 0, binding = 3) readonly buffer Bias { float bias[]; };

// The column part of C's index, (j / c_grp) * c_gs + j % c_grp. The GEMM shaders avoid this
// division per output: plain matrices use j, convolutions a table made once per tile.
uint out_col(uint j) {
  return (j / pc.c_grp) * pc.c_gs + (j % pc.c_grp);
}

// c = alpha * acc + beta * c (c unread when beta == 0) + bias, at off_c + i * c_rs + col.
void store_output(uint i, uint j, uint col, float acc) {
  const uint idx = pc.off_c + i * pc.c_rs + col;
  float v = pc.alpha * acc;
  if (pc.beta != 0.0) v += pc.beta * c[idx];
  if (pc.bias_mode == 1u) v += bias[pc.off_bias + i];
  if (pc.bias_mode == 2u) v += bias[pc.off_bias + j];
  c[idx] = v;
}
