// Sums the split-K partial products of a GEMM-shaped shader, part[off_a + (z * M + i) * N + j]
// over z, and applies the output epilogue of gemm_common.glsl.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "gemm_common.glsl"

layout(set = 0, binding = 0) readonly buffer Part { float part[]; };

void main() {
  const uint mn = pc.M * pc.N;
  for (uint t = gl_GlobalInvocationID.x; t < mn; t += grid_stride()) {
    float sum = 0.0;
    for (uint z = 0; z < pc.n_split; ++z) sum += part[pc.off_a + z * mn + t];
    const uint j = t % pc.N;
    store_output(t / pc.N, j, out_col(j), sum);
  }
}
