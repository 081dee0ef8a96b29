// oneDNN backend: pointwise convolutions (1x1, stride 1, no padding, one group) on the caller's
// NCHW tensors, each image a matrix product through oneDNN's sgemm: Y_n = W X_n with X_n the
// (C, H*W) matrix of image n. oneDNN's 1x1 convolution kernels want blocked activations, and the
// reorders to and from them cost more than the products themselves (MobileNetV2 on 28x28, batch
// 64: 41% of the time spent in oneDNN went to reorders, most of them around its 1x1 layers).
#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "onednn_backend.h"

namespace cleave::backend::detail {

namespace {

// One piece of work: columns [j0, j1) of image n's (rows, H*W) matrices.
struct piece {
  std::int64_t n, j0, j1;
};

// Images split into column ranges so that at least `threads` pieces exist (a batch smaller
// than the thread count still uses every thread); ranges are multiples of 16 columns.
std::vector<piece> pieces_of(std::int64_t n, std::int64_t hw, int threads) {
  const std::int64_t per_image = n >= threads ? 1 : (threads + n - 1) / n;
  std::int64_t width = (hw + per_image - 1) / per_image;
  width = std::max<std::int64_t>(16, (width + 15) / 16 * 16);
  std::vector<piece> out;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < hw; j += width) out.push_back({i, j, std::min(hw, j + width)});
  return out;
}

// dnnl_sgemm (row-major) with alpha 1: C = op(A) op(B) + beta C; returns its status.
dnnl_status_t gemm(char ta, char tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                   const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  return dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

// Runs `product(piece)` (a status) for every piece on `threads` threads; a failed status, if any.
template <class F>
dnnl_status_t each_piece(int threads, const std::vector<piece>& work, F&& product) {
  dnnl_status_t failed = dnnl_success;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::size_t i = 0; i < work.size(); ++i) {
    const dnnl_status_t s = product(work[i]);
    if (s != dnnl_success) {
#pragma omp critical(cleave_pointwise)
      failed = s;
    }
  }
  return failed;
}

void check_gemm(dnnl_status_t s, const char* what) {
  if (s != dnnl_success)
    throw core::error(std::string("oneDNN call failed: dnnl_sgemm for the pointwise convolution's ") + what +
                      " (status " + std::to_string(static_cast<int>(s)) + ")");
}

}  // namespace

bool onednn_backend::pointwise(const core::conv2d_desc& d, const core::conv_dims& c) const {
  return layout_ == conv_layout::automatic && c.r == 1 && c.s == 1 && d.stride_h == 1 && d.stride_w == 1 &&
         d.pad_h == 0 && d.pad_w == 0 && c.g == 1;
}

void onednn_backend::pointwise_forward(const core::conv_dims& c, const float* x, const float* w, const float* b,
                                       float* y) {
  const std::int64_t hw = c.h * c.w;
  const int threads = threads_for(2.0 * c.n * c.k * c.c * hw);
  const auto product = [&](const piece& pc) {
    // y_n[:, j0:j1] = W (K, C) x_n[:, j0:j1] (C, cols)
    float* yn = y + pc.n * c.k * hw + pc.j0;
    const std::int64_t cols = pc.j1 - pc.j0;
    const auto s = gemm('N', 'N', c.k, cols, c.c, w, c.c, x + pc.n * c.c * hw + pc.j0, hw, 0.0f, yn, hw);
    if (b)
      for (std::int64_t k = 0; k < c.k; ++k) {
        float* row = yn + k * hw;
        const float bk = b[k];
#pragma omp simd
        for (std::int64_t j = 0; j < cols; ++j) row[j] += bk;
      }
    return s;
  };
  check_gemm(each_piece(threads, pieces_of(c.n, hw, threads), product), "forward");
}

void onednn_backend::pointwise_backward_data(const core::conv_dims& c, const float* dy, const float* w, float* dx) {
  const std::int64_t hw = c.h * c.w;
  const int threads = threads_for(2.0 * c.n * c.k * c.c * hw);
  const auto product = [&](const piece& pc) {
    // dx_n[:, j0:j1] = W^T (C, K) dy_n[:, j0:j1] (K, cols)
    return gemm('T', 'N', c.c, pc.j1 - pc.j0, c.k, w, c.c, dy + pc.n * c.k * hw + pc.j0, hw, 0.0f,
                dx + pc.n * c.c * hw + pc.j0, hw);
  };
  check_gemm(each_piece(threads, pieces_of(c.n, hw, threads), product), "backward data");
}

void onednn_backend::pointwise_backward_weights(const core::conv_dims& c, const float* x, const float* dy, float* dw,
                                                float* db) {
  const std::int64_t hw = c.h * c.w, kc = c.k * c.c;
  const int threads = threads_for(2.0 * c.n * c.k * c.c * hw);
  // Each thread sums its pieces (a fixed contiguous range: a static schedule) into its own (K, C)
  // and (K) partials; the partials are added to dw and db in thread order, so a run repeats bit
  // for bit.
  const std::size_t stride = static_cast<std::size_t>(kc + c.k);
  float* partial = scratch_floats(stride * static_cast<std::size_t>(threads), 0);
  std::fill(partial, partial + stride * static_cast<std::size_t>(threads), 0.0f);
  const auto product = [&](const piece& pc) {
    float* pw = partial + stride * static_cast<std::size_t>(omp_get_thread_num());
    const float* dyn = dy + pc.n * c.k * hw + pc.j0;
    const std::int64_t cols = pc.j1 - pc.j0;
    // dW (K, C) += dy_n[:, j0:j1] (K, cols) x_n[:, j0:j1]^T (cols, C)
    const auto s = gemm('N', 'T', c.k, c.c, cols, dyn, hw, x + pc.n * c.c * hw + pc.j0, hw, 1.0f, pw, c.c);
    if (db)
      for (std::int64_t k = 0; k < c.k; ++k) {
        const float* row = dyn + k * hw;
        float s_k = 0.0f;
#pragma omp simd reduction(+ : s_k)
        for (std::int64_t j = 0; j < cols; ++j) s_k += row[j];
        pw[kc + k] += s_k;
      }
    return s;
  };
  check_gemm(each_piece(threads, pieces_of(c.n, hw, threads), product), "backward weights");
  for (int t = 0; t < threads; ++t) {
    const float* pw = partial + stride * static_cast<std::size_t>(t);
#pragma omp simd
    for (std::int64_t i = 0; i < kc; ++i) dw[i] += pw[i];
    if (db)
      for (std::int64_t k = 0; k < c.k; ++k) db[k] += pw[kc + k];
  }
}

}  // namespace cleave::backend::detail
