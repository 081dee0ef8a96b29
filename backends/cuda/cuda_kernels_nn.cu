// CUDA kernels of pooling, batch normalisation and softmax cross-entropy. Reductions accumulate
// in double in a fixed order (per block shape), so results repeat run to run.
#include "cuda_kernels.h"
#include "cuda_launch.cuh"

namespace cleave::backend::cuda_kernels {

namespace m = cuda_math;

// ---- pooling ----------------------------------------------------------------------------------

cudaError_t max_pool_forward(const float* x, float* y, std::int32_t* idx, i64 planes, const m::pool_geom& g,
                             cudaStream_t stream) {
  const i64 per = g.ph * g.pw;
  return for_each(planes * per, stream, [=] __device__(i64 i) {
    const i64 plane = i / per, o = i - plane * per;
    const i64 p = o / g.pw, q = o - p * g.pw;
    std::int32_t at;
    y[i] = m::max_pool_at(x + plane * g.h * g.w, g, p, q, &at);
    if (idx) idx[i] = at;
  });
}

cudaError_t avg_pool_forward(const float* x, float* y, i64 planes, const m::pool_geom& g, cudaStream_t stream) {
  const i64 per = g.ph * g.pw;
  return for_each(planes * per, stream, [=] __device__(i64 i) {
    const i64 plane = i / per, o = i - plane * per;
    const i64 p = o / g.pw, q = o - p * g.pw;
    y[i] = m::avg_pool_at(x + plane * g.h * g.w, g, p, q);
  });
}

cudaError_t max_pool_backward(const float* dy, const std::int32_t* idx, float* dx, i64 planes, const m::pool_geom& g,
                              cudaStream_t stream) {
  const i64 per = g.h * g.w, per_out = g.ph * g.pw;
  return for_each(planes * per, stream, [=] __device__(i64 i) {
    const i64 plane = i / per, o = i - plane * per;
    const i64 ih = o / g.w, iw = o - ih * g.w;
    dx[i] = m::max_pool_grad_at(dy + plane * per_out, idx + plane * per_out, g, ih, iw);
  });
}

cudaError_t avg_pool_backward(const float* dy, float* dx, i64 planes, const m::pool_geom& g, cudaStream_t stream) {
  const i64 per = g.h * g.w, per_out = g.ph * g.pw;
  return for_each(planes * per, stream, [=] __device__(i64 i) {
    const i64 plane = i / per, o = i - plane * per;
    const i64 ih = o / g.w, iw = o - ih * g.w;
    dx[i] = m::avg_pool_grad_at(dy + plane * per_out, g, ih, iw);
  });
}

// ---- batch norm -------------------------------------------------------------------------------

namespace {

// Blocks per channel for the statistics: enough blocks in all to fill the GPU, at least ~2048
// elements per block. A pure function of the shape (the scratch size depends on it).
i64 bn_splits(i64 n, i64 c, i64 hw) {
  const i64 len = n * hw;
  i64 s = (512 + c - 1) / c;
  const i64 by_len = (len + 2047) / 2048;
  if (s > by_len) s = by_len;
  if (s < 1) s = 1;
  if (s > 1024) s = 1024;
  return s;
}

struct bn_scratch {
  double2* partial;  // (c, splits)
  double2* stats;    // (c): forward {mean, invstd}; backward {sum_dy, sum_dy_xhat}
};

bn_scratch bn_layout(void* scratch, i64 c, i64 splits) {
  auto* base = static_cast<double2*>(scratch);
  return {base, base + c * splits};
}

// Element t of channel c's (n*hw) values, t in [0, n*hw).
__device__ inline i64 bn_offset(i64 t, i64 c, i64 n_c, i64 hw) {
  const i64 i = t / hw;
  return (i * n_c + c) * hw + (t - i * hw);
}

// partial[c, s] = {sum (x - x0), sum (x - x0)^2} over split s of channel c, x0 = x[0, c, 0]
// (the shift keeps the one-pass variance accurate).
__global__ void __launch_bounds__(k_block)
    bn_stats_kernel(const float* x, double2* partial, i64 n, i64 n_c, i64 hw, i64 splits) {
  const i64 s = blockIdx.x, c = blockIdx.y, len = n * hw;
  const i64 begin = len * s / splits, end = len * (s + 1) / splits;
  const double x0 = x[c * hw];
  double s1 = 0.0, s2 = 0.0;
  for (i64 t = begin + threadIdx.x; t < end; t += k_block) {
    const double d = x[bn_offset(t, c, n_c, hw)] - x0;
    s1 += d;
    s2 += d * d;
  }
  s1 = block_sum(s1);
  s2 = block_sum(s2);
  if (threadIdx.x == 0) partial[c * splits + s] = make_double2(s1, s2);
}

__global__ void bn_finalize_forward_kernel(const float* x, const double2* partial, double2* stats, float* save_mean,
                                           float* save_invstd, float* running_mean, float* running_var, i64 n, i64 n_c,
                                           i64 hw, i64 splits, float eps, float momentum) {
  const i64 c = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n_c) return;
  double s1 = 0.0, s2 = 0.0;
  for (i64 s = 0; s < splits; ++s) {
    s1 += partial[c * splits + s].x;
    s2 += partial[c * splits + s].y;
  }
  const m::bn_stats st = m::bn_finalize(s1, s2, x[c * hw], static_cast<double>(n * hw), eps);
  stats[c] = make_double2(st.mean, st.invstd);
  save_mean[c] = static_cast<float>(st.mean);
  save_invstd[c] = static_cast<float>(st.invstd);
  running_mean[c] = m::bn_running(running_mean[c], momentum, st.mean);
  running_var[c] = m::bn_running(running_var[c], momentum, st.unbiased);
}

// partial[c, s] = {sum dy, sum dy * xhat} over split s of channel c.
__global__ void __launch_bounds__(k_block)
    bn_grad_stats_kernel(const float* x, const float* dy, const float* save_mean, const float* save_invstd,
                         double2* partial, i64 n, i64 n_c, i64 hw, i64 splits) {
  const i64 s = blockIdx.x, c = blockIdx.y, len = n * hw;
  const i64 begin = len * s / splits, end = len * (s + 1) / splits;
  const float mean = save_mean[c], invstd = save_invstd[c];
  double s1 = 0.0, s2 = 0.0;
  for (i64 t = begin + threadIdx.x; t < end; t += k_block) {
    const i64 k = bn_offset(t, c, n_c, hw);
    s1 += dy[k];
    s2 += dy[k] * m::bn_xhat(x[k], mean, invstd);
  }
  s1 = block_sum(s1);
  s2 = block_sum(s2);
  if (threadIdx.x == 0) partial[c * splits + s] = make_double2(s1, s2);
}

__global__ void bn_finalize_backward_kernel(const double2* partial, double2* stats, float* dgamma, float* dbeta,
                                            i64 n_c, i64 splits) {
  const i64 c = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n_c) return;
  double s1 = 0.0, s2 = 0.0;
  for (i64 s = 0; s < splits; ++s) {
    s1 += partial[c * splits + s].x;
    s2 += partial[c * splits + s].y;
  }
  stats[c] = make_double2(s1, s2);
  dgamma[c] += static_cast<float>(s2);
  dbeta[c] += static_cast<float>(s1);
}

unsigned per_channel_grid(i64 c) {
  return static_cast<unsigned>((c + k_block - 1) / k_block);
}

}  // namespace

std::size_t batchnorm_scratch_bytes(i64 n, i64 c, i64 hw) {
  return static_cast<std::size_t>(c * bn_splits(n, c, hw) + c) * sizeof(double2);
}

cudaError_t batchnorm_forward_train(const float* x, const float* gamma, const float* beta, float* y, float* save_mean,
                                    float* save_invstd, float* running_mean, float* running_var, i64 n, i64 c, i64 hw,
                                    float eps, float momentum, void* scratch, cudaStream_t stream) {
  if (c <= 0 || n * hw <= 0) return cudaSuccess;
  const i64 splits = bn_splits(n, c, hw);
  const bn_scratch ws = bn_layout(scratch, c, splits);
  bn_stats_kernel<<<dim3(static_cast<unsigned>(splits), static_cast<unsigned>(c)), k_block, 0, stream>>>(
      x, ws.partial, n, c, hw, splits);
  bn_finalize_forward_kernel<<<per_channel_grid(c), k_block, 0, stream>>>(
      x, ws.partial, ws.stats, save_mean, save_invstd, running_mean, running_var, n, c, hw, splits, eps, momentum);
  const double2* stats = ws.stats;
  return for_each(n * c * hw, stream, [=] __device__(i64 i) {
    const i64 ch = (i / hw) % c;
    const double2 st = stats[ch];
    y[i] = m::bn_normalize(x[i], gamma[ch], beta[ch], st.x, st.y);
  });
}

cudaError_t batchnorm_forward_infer(const float* x, const float* gamma, const float* beta, const float* running_mean,
                                    const float* running_var, float* y, i64 n, i64 c, i64 hw, float eps,
                                    cudaStream_t stream) {
  return for_each(n * c * hw, stream, [=] __device__(i64 i) {
    const i64 ch = (i / hw) % c;
    const double invstd = 1.0 / sqrt(static_cast<double>(running_var[ch]) + eps);
    // As the reference: (x - running_mean) in f32, the rest in double.
    y[i] = static_cast<float>(gamma[ch] * (x[i] - running_mean[ch]) * invstd + beta[ch]);
  });
}

cudaError_t batchnorm_backward(const float* x, const float* dy, const float* gamma, const float* save_mean,
                               const float* save_invstd, float* dx, float* dgamma, float* dbeta, i64 n, i64 c, i64 hw,
                               void* scratch, cudaStream_t stream) {
  if (c <= 0 || n * hw <= 0) return cudaSuccess;
  const i64 splits = bn_splits(n, c, hw);
  const bn_scratch ws = bn_layout(scratch, c, splits);
  bn_grad_stats_kernel<<<dim3(static_cast<unsigned>(splits), static_cast<unsigned>(c)), k_block, 0, stream>>>(
      x, dy, save_mean, save_invstd, ws.partial, n, c, hw, splits);
  bn_finalize_backward_kernel<<<per_channel_grid(c), k_block, 0, stream>>>(ws.partial, ws.stats, dgamma, dbeta, c,
                                                                           splits);
  const double2* sums = ws.stats;
  const double count = static_cast<double>(n * hw);
  return for_each(n * c * hw, stream, [=] __device__(i64 i) {
    const i64 ch = (i / hw) % c;
    const double2 s = sums[ch];
    dx[i] = m::bn_grad_input(x[i], dy[i], gamma[ch], save_mean[ch], save_invstd[ch], s.x, s.y, count);
  });
}

// ---- softmax cross-entropy ----------------------------------------------------------------------

namespace {

constexpr int k_rows_per_block = k_block / 32;  // one warp per row

// probs row = softmax(logits row); row_loss[row] = -log probs[row, label] (NaN for a label
// outside [0, k)).
__global__ void __launch_bounds__(k_block)
    softmax_rows_kernel(const float* logits, const std::int32_t* labels, float* probs, double* row_loss, i64 n, i64 k) {
  const i64 row = static_cast<i64>(blockIdx.x) * k_rows_per_block + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= n) return;  // whole warps leave together
  const float* r = logits + row * k;
  float mx = -INFINITY;
  for (i64 j = lane; j < k; j += 32) mx = fmaxf(mx, r[j]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  double sum = 0.0;
  for (i64 j = lane; j < k; j += 32) sum += exp(static_cast<double>(r[j]) - mx);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  for (i64 j = lane; j < k; j += 32) probs[row * k + j] = static_cast<float>(exp(static_cast<double>(r[j]) - mx) / sum);
  if (lane == 0) {
    const std::int32_t lab = labels[row];
    row_loss[row] = lab >= 0 && lab < k ? -(static_cast<double>(r[lab]) - mx - log(sum)) : nan("");
  }
}

__global__ void __launch_bounds__(k_block) mean_kernel(const double* v, float* out, i64 n) {
  double acc = 0.0;
  for (i64 i = threadIdx.x; i < n; i += k_block) acc += v[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc / static_cast<double>(n));
}

}  // namespace

std::size_t softmax_xent_scratch_bytes(i64 n) {
  return static_cast<std::size_t>(n) * sizeof(double);
}

cudaError_t softmax_xent_forward(const float* logits, const std::int32_t* labels, float* probs, float* loss, i64 n,
                                 i64 k, void* scratch, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  auto* row_loss = static_cast<double*>(scratch);
  const auto blocks = static_cast<unsigned>((n + k_rows_per_block - 1) / k_rows_per_block);
  softmax_rows_kernel<<<blocks, k_block, 0, stream>>>(logits, labels, probs, row_loss, n, k);
  mean_kernel<<<1, k_block, 0, stream>>>(row_loss, loss, n);
  return cudaGetLastError();
}

cudaError_t softmax_xent_backward(const float* probs, const std::int32_t* labels, float* dlogits, i64 n, i64 k,
                                  float scale_over_n, cudaStream_t stream) {
  return for_each(n * k, stream, [=] __device__(i64 i) {
    const i64 row = i / k, j = i - row * k;
    dlogits[i] = (probs[i] - (j == labels[row] ? 1.0f : 0.0f)) * scale_over_n;
  });
}

}  // namespace cleave::backend::cuda_kernels
