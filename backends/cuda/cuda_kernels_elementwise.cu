// CUDA kernels of the element-wise ops, casts, dropout, biases, optimizer updates.
// Scalar formulas come from cuda_device_math.h, shared with the host tests.
#include "cuda_kernels.h"
#include "cuda_launch.cuh"

namespace cleave::backend::cuda_kernels {

namespace m = cuda_math;

cudaError_t fill(float* y, i64 n, float value, cudaStream_t stream) {
  return for_each(n, stream, [=] __device__(i64 i) { y[i] = value; });
}

cudaError_t add(const float* a, const float* b, float* y, i64 n, cudaStream_t stream) {
  return for_each(n, stream, [=] __device__(i64 i) { y[i] = a[i] + b[i]; });
}

cudaError_t mul(const float* a, const float* b, float* y, i64 n, cudaStream_t stream) {
  return for_each(n, stream, [=] __device__(i64 i) { y[i] = a[i] * b[i]; });
}

cudaError_t axpy(float alpha, const float* x, float* y, i64 n, cudaStream_t stream) {
  return for_each(n, stream, [=] __device__(i64 i) { y[i] += alpha * x[i]; });
}

cudaError_t scale(float* y, float alpha, i64 n, cudaStream_t stream) {
  return for_each(n, stream, [=] __device__(i64 i) { y[i] *= alpha; });
}

cudaError_t cast(const void* src, int src_dt, void* dst, int dst_dt, i64 n, cudaStream_t stream) {
  return for_each(n, stream, [=] __device__(i64 i) { m::cast_at(src, src_dt, dst, dst_dt, i); });
}

cudaError_t relu_forward(const float* x, float* y, i64 n, cudaStream_t stream) {
  return for_each(n, stream, [=] __device__(i64 i) {
    const float v = x[i];
    y[i] = v > 0.0f ? v : 0.0f;
  });
}

cudaError_t relu_backward(const float* y, const float* dy, float* dx, i64 n, cudaStream_t stream) {
  return for_each(n, stream, [=] __device__(i64 i) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; });
}

cudaError_t clamp_forward(const float* x, float* y, i64 n, float lo, float hi, cudaStream_t stream) {
  return for_each(n, stream, [=] __device__(i64 i) {
    // Comparisons, not fminf/fmaxf: a NaN stays NaN, as on the reference.
    const float v = x[i];
    y[i] = v < lo ? lo : (v > hi ? hi : v);
  });
}

cudaError_t clamp_backward(const float* y, const float* dy, float* dx, i64 n, float lo, float hi, cudaStream_t stream) {
  return for_each(n, stream, [=] __device__(i64 i) { dx[i] = y[i] > lo && y[i] < hi ? dy[i] : 0.0f; });
}

cudaError_t dropout_forward(const float* x, float* y, float* mask, i64 n, std::uint32_t threshold, float keep_scale,
                            std::uint32_t seed, cudaStream_t stream) {
  return for_each(n, stream, [=] __device__(i64 i) {
    // The element index is taken modulo 2^32, as the reference's uint32 cast does.
    const float k = m::dropout_keep(seed, static_cast<std::uint32_t>(i), threshold) ? keep_scale : 0.0f;
    mask[i] = k;
    y[i] = x[i] * k;
  });
}

cudaError_t broadcast_rows(const float* b, float* y, i64 rows, i64 cols, cudaStream_t stream) {
  return for_each(rows * cols, stream, [=] __device__(i64 i) { y[i] = b[i % cols]; });
}

cudaError_t add_channel_bias(const float* b, float* y, i64 n, i64 k, i64 hw, cudaStream_t stream) {
  return for_each(n * k * hw, stream, [=] __device__(i64 i) { y[i] += b[(i / hw) % k]; });
}

namespace {

// One block per channel c: db[c] += sum over (i, j) of dy[i, c, j].
__global__ void __launch_bounds__(k_block) channel_sum_kernel(const float* dy, float* db, i64 n, i64 k, i64 hw) {
  const i64 c = blockIdx.x;
  const i64 len = n * hw;
  double acc = 0.0;
  for (i64 t = threadIdx.x; t < len; t += k_block) {
    const i64 i = t / hw, j = t - i * hw;
    acc += dy[(i * k + c) * hw + j];
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) db[c] += static_cast<float>(acc);
}

}  // namespace

cudaError_t channel_sum_accumulate(const float* dy, float* db, i64 n, i64 k, i64 hw, cudaStream_t stream) {
  if (k <= 0) return cudaSuccess;
  channel_sum_kernel<<<static_cast<unsigned>(k), k_block, 0, stream>>>(dy, db, n, k, hw);
  return cudaGetLastError();
}

namespace {

// One block per channel c (grid-stride over channels): the largest absmax key of the channel.
__global__ void __launch_bounds__(k_block)
    channel_absmax_kernel(const float* x, float* amax, i64 outer, i64 channels, i64 inner) {
  __shared__ std::uint32_t top;
  for (i64 c = blockIdx.x; c < channels; c += gridDim.x) {
    if (threadIdx.x == 0) top = 0;
    __syncthreads();
    std::uint32_t mine = 0;
    for (i64 t = threadIdx.x; t < outer * inner; t += k_block) {
      const i64 o = t / inner, j = t - o * inner;
      mine = max(mine, m::absmax_key(x[(o * channels + c) * inner + j]));
    }
    atomicMax(&top, mine);
    __syncthreads();
    if (threadIdx.x == 0) amax[c] = m::absmax_of_key(top);
    __syncthreads();
  }
}

}  // namespace

cudaError_t channel_absmax(const float* x, float* amax, i64 outer, i64 channels, i64 inner, cudaStream_t stream) {
  if (channels <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(channels < 65535 ? channels : 65535);
  channel_absmax_kernel<<<blocks, k_block, 0, stream>>>(x, amax, outer, channels, inner);
  return cudaGetLastError();
}

cudaError_t quantize_int8(const float* x, const float* inv, std::int8_t* q, i64 outer, i64 channels, i64 inner,
                          bool stochastic, std::uint32_t seed, cudaStream_t stream) {
  return for_each(outer * channels * inner, stream, [=] __device__(i64 e) {
    // The flat index is taken modulo 2^32, as the host's uint32 cast does.
    q[e] = m::quantize_one(x[e], inv[(e / inner) % channels], stochastic, seed, static_cast<std::uint32_t>(e));
  });
}

cudaError_t dequantize_int8(const std::int8_t* q, const float* scales, float* y, i64 outer, i64 channels, i64 inner,
                            cudaStream_t stream) {
  return for_each(outer * channels * inner, stream, [=] __device__(i64 e) {
    y[e] = __fmul_rn(static_cast<float>(q[e]), scales[(e / inner) % channels]);
  });
}

cudaError_t check_kernel_image() {
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, channel_sum_kernel);
}

cudaError_t sgd_update(float* param, const float* grad, float* buf, i64 n, const m::sgd_params& d,
                       cudaStream_t stream) {
  return for_each(n, stream, [=] __device__(i64 i) { m::sgd_step(param + i, grad[i], buf ? buf + i : nullptr, d); });
}

cudaError_t adamw_update(float* param, const float* grad, float* mm, float* v, i64 n, const m::adamw_params& d,
                         cudaStream_t stream) {
  return for_each(n, stream, [=] __device__(i64 i) { m::adamw_step(param + i, grad[i], mm + i, v + i, d); });
}

}  // namespace cleave::backend::cuda_kernels
