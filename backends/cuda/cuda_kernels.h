// Launchers of the CUDA backend's own kernels: plain pointers and counts, C++17, so the .cu
// files never see the C++20 core headers. Each enqueues on `stream` and returns the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda_device_math.h"

namespace cleave::backend::cuda_kernels {

using i64 = std::int64_t;

// cudaSuccess when this build has code the current device can run (else the error saying why).
cudaError_t check_kernel_image();

// ---- element-wise (n elements) --------------------------------------------------------------
cudaError_t fill(float* y, i64 n, float value, cudaStream_t stream);
// y = a + b; y may alias a or b
cudaError_t add(const float* a, const float* b, float* y, i64 n, cudaStream_t stream);
// y = a * b; y may alias a or b
cudaError_t mul(const float* a, const float* b, float* y, i64 n, cudaStream_t stream);
// y += alpha x
cudaError_t axpy(float alpha, const float* x, float* y, i64 n, cudaStream_t stream);
// y *= alpha
cudaError_t scale(float* y, float alpha, i64 n, cudaStream_t stream);
// dst = convert(src); dtype codes as cuda_math::dtype_code, src_dt != dst_dt
cudaError_t cast(const void* src, int src_dt, void* dst, int dst_dt, i64 n, cudaStream_t stream);
// y = max(x, 0)
cudaError_t relu_forward(const float* x, float* y, i64 n, cudaStream_t stream);
// dx = y > 0 ? dy : 0
cudaError_t relu_backward(const float* y, const float* dy, float* dx, i64 n, cudaStream_t stream);
// y = min(max(x, lo), hi)
cudaError_t clamp_forward(const float* x, float* y, i64 n, float lo, float hi, cudaStream_t stream);
// dx = lo < y < hi ? dy : 0
cudaError_t clamp_backward(const float* y, const float* dy, float* dx, i64 n, float lo, float hi, cudaStream_t stream);
// mask = dropout_keep(seed, i, threshold) ? keep_scale : 0; y = x * mask
cudaError_t dropout_forward(const float* x, float* y, float* mask, i64 n, std::uint32_t threshold, float keep_scale,
                            std::uint32_t seed, cudaStream_t stream);

// ---- the int8 cut codec: x, q, y (outer, channels, inner), per-channel vectors (channels) ----
// amax[c] = max |x| over channel c, NaN where it holds a non-finite value
cudaError_t channel_absmax(const float* x, float* amax, i64 outer, i64 channels, i64 inner, cudaStream_t stream);
// q = cuda_math::quantize_one(x, inv[c], ...) at every flat index
cudaError_t quantize_int8(const float* x, const float* inv, std::int8_t* q, i64 outer, i64 channels, i64 inner,
                          bool stochastic, std::uint32_t seed, cudaStream_t stream);
// y = q * scales[c]
cudaError_t dequantize_int8(const std::int8_t* q, const float* scales, float* y, i64 outer, i64 channels, i64 inner,
                            cudaStream_t stream);

// ---- bias and per-channel sums --------------------------------------------------------------
// y (rows, cols): y[r, c] = b[c]  (prefill before a GEMM with beta = 1)
cudaError_t broadcast_rows(const float* b, float* y, i64 rows, i64 cols, cudaStream_t stream);
// y (n, k, hw): y[i, c, j] += b[c]
cudaError_t add_channel_bias(const float* b, float* y, i64 n, i64 k, i64 hw, cudaStream_t stream);
// dy (n, k, hw), db (k): db[c] += sum_{i,j} dy[i, c, j] (double accumulation, fixed order)
cudaError_t channel_sum_accumulate(const float* dy, float* db, i64 n, i64 k, i64 hw, cudaStream_t stream);

// ---- pooling: x (planes, h, w), y (planes, ph, pw) ------------------------------------------
// idx (planes, ph, pw) may be null (inference)
cudaError_t max_pool_forward(const float* x, float* y, std::int32_t* idx, i64 planes, const cuda_math::pool_geom& g,
                             cudaStream_t stream);
cudaError_t avg_pool_forward(const float* x, float* y, i64 planes, const cuda_math::pool_geom& g, cudaStream_t stream);
// dx (overwrite) from dy and the forward's argmax
cudaError_t max_pool_backward(const float* dy, const std::int32_t* idx, float* dx, i64 planes,
                              const cuda_math::pool_geom& g, cudaStream_t stream);
cudaError_t avg_pool_backward(const float* dy, float* dx, i64 planes, const cuda_math::pool_geom& g,
                              cudaStream_t stream);

// ---- batch norm: x (n, c, hw), per-channel vectors (c) --------------------------------------
// Bytes of device scratch the batch norm launchers need for these sizes.
std::size_t batchnorm_scratch_bytes(i64 n, i64 c, i64 hw);
cudaError_t batchnorm_forward_train(const float* x, const float* gamma, const float* beta, float* y, float* save_mean,
                                    float* save_invstd, float* running_mean, float* running_var, i64 n, i64 c, i64 hw,
                                    float eps, float momentum, void* scratch, cudaStream_t stream);
cudaError_t batchnorm_forward_infer(const float* x, const float* gamma, const float* beta, const float* running_mean,
                                    const float* running_var, float* y, i64 n, i64 c, i64 hw, float eps,
                                    cudaStream_t stream);
// dx overwritten, dgamma and dbeta accumulated
cudaError_t batchnorm_backward(const float* x, const float* dy, const float* gamma, const float* save_mean,
                               const float* save_invstd, float* dx, float* dgamma, float* dbeta, i64 n, i64 c, i64 hw,
                               void* scratch, cudaStream_t stream);

// ---- softmax cross-entropy: logits, probs (n, k), labels (n) --------------------------------
std::size_t softmax_xent_scratch_bytes(i64 n);
cudaError_t softmax_xent_forward(const float* logits, const std::int32_t* labels, float* probs, float* loss, i64 n,
                                 i64 k, void* scratch, cudaStream_t stream);
// dlogits = (probs - onehot(labels)) * (scale / n)
cudaError_t softmax_xent_backward(const float* probs, const std::int32_t* labels, float* dlogits, i64 n, i64 k,
                                  float scale_over_n, cudaStream_t stream);

// ---- optimizers (n elements) ----------------------------------------------------------------
// buf may be null when d.momentum == 0
cudaError_t sgd_update(float* param, const float* grad, float* buf, i64 n, const cuda_math::sgd_params& d,
                       cudaStream_t stream);
cudaError_t adamw_update(float* param, const float* grad, float* m, float* v, i64 n, const cuda_math::adamw_params& d,
                         cudaStream_t stream);

}  // namespace cleave::backend::cuda_kernels
