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
