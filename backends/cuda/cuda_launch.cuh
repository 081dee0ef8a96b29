// Launch helpers shared by the CUDA kernel files: grid-stride element loops and deterministic
// block reductions in double.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cleave::backend::cuda_kernels {

constexpr int k_block = 256;  // threads per block everywhere (the reductions assume it)

inline unsigned grid_for(std::int64_t n) {
  const std::int64_t blocks = (n + k_block - 1) / k_block;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

template <class F>
__global__ void __launch_bounds__(k_block) for_each_kernel(std::int64_t n, F f) {
  const std::int64_t step = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) f(i);
}

// Runs f(i) for i in [0, n) on `stream`.
template <class F>
cudaError_t for_each(std::int64_t n, cudaStream_t stream, F f) {
  if (n <= 0) return cudaSuccess;
  for_each_kernel<<<grid_for(n), k_block, 0, stream>>>(n, f);
  return cudaGetLastError();
}

// Sum of v over the block (k_block threads); the result is valid in thread 0. The order of
// additions is fixed by the block shape, so results repeat run to run.
__device__ inline double block_sum(double v) {
  __shared__ double partial[k_block / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < k_block / 32 ? partial[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  }
  return v;
}

}  // namespace cleave::backend::cuda_kernels
