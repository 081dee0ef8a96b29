// CUDA backend: set-up, memory, element-wise ops, dense layers (cuBLAS), pooling, batch norm,
// loss and optimizers (own kernels). Convolutions are in cuda_conv.cpp.
#include "cuda_backend.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "cleave/core/error.h"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_tensor.h"

namespace cleave::backend::detail {

using core::tensor;
namespace k = cuda_kernels;

static_assert(static_cast<int>(core::dtype::f32) == cuda_math::dt_f32 &&
                  static_cast<int>(core::dtype::f16) == cuda_math::dt_f16 &&
                  static_cast<int>(core::dtype::bf16) == cuda_math::dt_bf16 &&
                  static_cast<int>(core::dtype::i8) == cuda_math::dt_i8 &&
                  static_cast<int>(core::dtype::u8) == cuda_math::dt_u8 &&
                  static_cast<int>(core::dtype::i32) == cuda_math::dt_i32,
              "dtype codes of the kernels must equal core::dtype");

namespace {

void same_numel(const tensor& a, const tensor& b, const char* op) {
  CLEAVE_ASSERT(a.numel() == b.numel(),
                std::string(op) + ": element counts differ: " + a.shape().str() + " vs " + b.shape().str());
}

// (N,C,H,W) or (N,C): n, c and the spatial size per channel.
struct nc_hw {
  std::int64_t n, c, hw;
};
nc_hw split_nc(const tensor& x) {
  const auto& s = x.shape();
  CLEAVE_ASSERT(s.rank() == 2 || s.rank() == 4, "batch norm input must be (N,C) or (N,C,H,W), got " + s.str());
  return {s[0], s[1], s.rank() == 4 ? s[2] * s[3] : 1};
}

int as_int(std::int64_t v, const char* what) {
  CLEAVE_ASSERT(v >= 0 && v <= INT_MAX, std::string(what) + " does not fit cuBLAS's int");
  return static_cast<int>(v);
}

}  // namespace

cuda_backend::cuda_backend(const cuda_spec& spec) : device_(spec.device), tf32_(spec.tf32) {
  int n_devices = 0;
  CLEAVE_CHECK_CUDA(cudaGetDeviceCount(&n_devices));
  if (device_ < 0 || device_ >= n_devices)
    throw core::error("cuda: device index " + std::to_string(device_) + " out of range (" + std::to_string(n_devices) +
                      " device(s))");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::check_kernel_image());
  cudaDeviceProp prop{};
  CLEAVE_CHECK_CUDA(cudaGetDeviceProperties(&prop, device_));
  device_name_ = std::string(prop.name) + " (cuda:" + std::to_string(device_) + ", sm_" + std::to_string(prop.major) +
                 std::to_string(prop.minor) + ", " + std::to_string(prop.totalGlobalMem >> 20) + " MiB" +
                 (tf32_ ? ", tf32" : "") + ")";
  try {
    CLEAVE_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CLEAVE_CHECK_CUBLAS(cublasCreate(&cublas_));
    CLEAVE_CHECK_CUBLAS(cublasSetStream(cublas_, stream_));
    // Default math keeps f32 products in f32 (no TF32); TF32 tensor cores only when asked.
    CLEAVE_CHECK_CUBLAS(cublasSetMathMode(cublas_, tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    CLEAVE_CHECK_CUDNN(cudnnCreate(&cudnn_));
    CLEAVE_CHECK_CUDNN(cudnnSetStream(cudnn_, stream_));
  } catch (...) {
    if (cudnn_) cudnnDestroy(cudnn_);
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
    throw;
  }
  alloc_ = std::make_shared<device_allocator>(device_);
}

cuda_backend::~cuda_backend() {
  device_guard g(device_);
  const cudaError_t e = cudaStreamSynchronize(stream_);
  conv_plans_.clear();
  // A backend destroyed by a static destructor after the CUDA runtime has shut down leaves
  // its handles to the process exit instead of calling into a runtime that is gone.
  if (e == cudaErrorCudartUnloading || e == cudaErrorContextIsDestroyed) return;
  cudnnDestroy(cudnn_);
  cublasDestroy(cublas_);
  cudaStreamDestroy(stream_);
}

core::buffer_ptr cuda_backend::allocate(std::size_t bytes) {
  device_guard g(device_);
  return std::make_shared<device_buffer>(this, bytes, alloc_);
}

void cuda_backend::upload(const tensor& dst, const void* src) {
  expect_mine(*this, dst, "upload: dst");
  if (!dst.bytes()) return;
  device_guard g(device_);
  staging_.upload(raw(dst), src, dst.bytes(), stream_);
}

void cuda_backend::download(const tensor& src, void* dst) {
  expect_mine(*this, src, "download: src");
  if (!src.bytes()) return;
  device_guard g(device_);
  staging_.download(dst, raw(src), src.bytes(), stream_);
}

void cuda_backend::synchronize() {
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(cudaStreamSynchronize(stream_));
}

// ---- element-wise ---------------------------------------------------------------------------

void cuda_backend::fill(const tensor& t, float value) {
  float* p = f32(*this, t, "fill: t");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::fill(p, t.numel(), value, stream_));
}

void cuda_backend::copy(const tensor& src, const tensor& dst) {
  expect_mine(*this, src, "copy: src");
  expect_mine(*this, dst, "copy: dst");
  CLEAVE_ASSERT(src.dtype() == dst.dtype(), "copy: dtypes differ");
  same_numel(src, dst, "copy");
  const std::size_t n = src.bytes();
  if (!n || (src.buf() == dst.buf() && src.offset() == dst.offset())) return;
  device_guard g(device_);
  const bool overlap = src.buf() == dst.buf() && src.offset() < dst.offset() + n && dst.offset() < src.offset() + n;
  if (overlap) {  // memmove semantics: go through a temporary
    auto tmp = scratch(n);
    void* t = static_cast<device_buffer*>(tmp.get())->device_data();
    CLEAVE_CHECK_CUDA(cudaMemcpyAsync(t, raw(src), n, cudaMemcpyDeviceToDevice, stream_));
    CLEAVE_CHECK_CUDA(cudaMemcpyAsync(raw(dst), t, n, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  CLEAVE_CHECK_CUDA(cudaMemcpyAsync(raw(dst), raw(src), n, cudaMemcpyDeviceToDevice, stream_));
}

void cuda_backend::cast(const tensor& src, const tensor& dst) {
  expect_mine(*this, src, "cast: src");
  expect_mine(*this, dst, "cast: dst");
  same_numel(src, dst, "cast");
  if (src.dtype() == dst.dtype()) return copy(src, dst);
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(
      k::cast(raw(src), static_cast<int>(src.dtype()), raw(dst), static_cast<int>(dst.dtype()), src.numel(), stream_));
}

void cuda_backend::add(const tensor& a, const tensor& b, const tensor& y) {
  same_numel(a, y, "add");
  same_numel(b, y, "add");
  const float *pa = f32(*this, a, "add: a"), *pb = f32(*this, b, "add: b");
  float* py = f32(*this, y, "add: y");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::add(pa, pb, py, y.numel(), stream_));
}

void cuda_backend::mul(const tensor& a, const tensor& b, const tensor& y) {
  same_numel(a, y, "mul");
  same_numel(b, y, "mul");
  const float *pa = f32(*this, a, "mul: a"), *pb = f32(*this, b, "mul: b");
  float* py = f32(*this, y, "mul: y");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::mul(pa, pb, py, y.numel(), stream_));
}

void cuda_backend::axpy(float alpha, const tensor& x, const tensor& y) {
  same_numel(x, y, "axpy");
  const float* px = f32(*this, x, "axpy: x");
  float* py = f32(*this, y, "axpy: y");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::axpy(alpha, px, py, y.numel(), stream_));
}

void cuda_backend::scale(const tensor& y, float alpha) {
  float* py = f32(*this, y, "scale: y");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::scale(py, alpha, y.numel(), stream_));
}

// ---- activations ----------------------------------------------------------------------------

void cuda_backend::relu_forward(const tensor& x, const tensor& y) {
  same_numel(x, y, "relu_forward");
  const float* px = f32(*this, x, "relu_forward: x");
  float* py = f32(*this, y, "relu_forward: y");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::relu_forward(px, py, y.numel(), stream_));
}

void cuda_backend::relu_backward(const tensor& y, const tensor& dy, const tensor& dx) {
  same_numel(y, dy, "relu_backward");
  same_numel(dy, dx, "relu_backward");
  const float *py = f32(*this, y, "relu_backward: y"), *pdy = f32(*this, dy, "relu_backward: dy");
  float* pdx = f32(*this, dx, "relu_backward: dx");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::relu_backward(py, pdy, pdx, dx.numel(), stream_));
}

void cuda_backend::clamp_forward(const tensor& x, const tensor& y, float lo, float hi) {
  same_numel(x, y, "clamp_forward");
  CLEAVE_ASSERT(lo < hi, "clamp_forward: lo must be below hi");
  const float* px = f32(*this, x, "clamp_forward: x");
  float* py = f32(*this, y, "clamp_forward: y");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::clamp_forward(px, py, y.numel(), lo, hi, stream_));
}

void cuda_backend::clamp_backward(const tensor& y, const tensor& dy, const tensor& dx, float lo, float hi) {
  same_numel(y, dy, "clamp_backward");
  same_numel(dy, dx, "clamp_backward");
  const float *py = f32(*this, y, "clamp_backward: y"), *pdy = f32(*this, dy, "clamp_backward: dy");
  float* pdx = f32(*this, dx, "clamp_backward: dx");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::clamp_backward(py, pdy, pdx, dx.numel(), lo, hi, stream_));
}

void cuda_backend::dropout_forward(const tensor& x, const tensor& y, const tensor& mask, float p, std::uint32_t seed) {
  same_numel(x, y, "dropout_forward");
  same_numel(x, mask, "dropout_forward");
  CLEAVE_ASSERT(p >= 0.0f && p < 1.0f, "dropout probability out of [0,1)");
  const float* px = f32(*this, x, "dropout_forward: x");
  float *py = f32(*this, y, "dropout_forward: y"), *pm = f32(*this, mask, "dropout_forward: mask");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(
      k::dropout_forward(px, py, pm, x.numel(), core::dropout_threshold(p), 1.0f / (1.0f - p), seed, stream_));
}

// ---- dense ----------------------------------------------------------------------------------

// Row-major c (m,n) = alpha op(a) op(b) + beta c, as the column-major product c^T = op(b)^T op(a)^T.
void cuda_backend::gemm(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t kk,
                        bool trans_a, bool trans_b, float alpha, float beta) {
  if (m == 0 || n == 0) return;
  const int im = as_int(m, "matmul m"), in = as_int(n, "matmul n"), ik = as_int(kk, "matmul k");
  const int lda = trans_a ? im : ik, ldb = trans_b ? ik : in;
  CLEAVE_CHECK_CUBLAS(cublasSgemm(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, in,
                                  im, ik, &alpha, b, std::max(ldb, 1), a, std::max(lda, 1), &beta, c, in));
}

void cuda_backend::matmul(const tensor& a, const tensor& b, const tensor& c, bool trans_a, bool trans_b, float alpha,
                          float beta) {
  CLEAVE_ASSERT(a.shape().rank() == 2 && b.shape().rank() == 2 && c.shape().rank() == 2, "matmul needs 2-D tensors");
  const std::int64_t m = c.shape()[0], n = c.shape()[1];
  const std::int64_t kk = trans_a ? a.shape()[0] : a.shape()[1];
  CLEAVE_ASSERT((trans_a ? a.shape()[1] : a.shape()[0]) == m, "matmul: a rows");
  CLEAVE_ASSERT((trans_b ? b.shape()[1] : b.shape()[0]) == kk && (trans_b ? b.shape()[0] : b.shape()[1]) == n,
                "matmul: b shape");
  const float *pa = f32(*this, a, "matmul: a"), *pb = f32(*this, b, "matmul: b");
  float* pc = f32(*this, c, "matmul: c");
  device_guard g(device_);
  gemm(pa, pb, pc, m, n, kk, trans_a, trans_b, alpha, beta);
}

void cuda_backend::linear_forward(const tensor& x, const tensor& w, const tensor& b, const tensor& y) {
  const std::int64_t n = x.shape()[0], in = w.shape()[1], out = w.shape()[0];
  CLEAVE_ASSERT(x.numel() == n * in && y.numel() == n * out, "linear_forward shapes");
  const float *px = f32(*this, x, "linear_forward: x"), *pw = f32(*this, w, "linear_forward: w");
  float* py = f32(*this, y, "linear_forward: y");
  device_guard g(device_);
  if (b.defined()) {
    CLEAVE_ASSERT(b.numel() == out, "linear_forward: bias size");
    CLEAVE_CHECK_CUDA(k::broadcast_rows(f32(*this, b, "linear_forward: b"), py, n, out, stream_));
  }
  gemm(px, pw, py, n, out, in, false, true, 1.0f, b.defined() ? 1.0f : 0.0f);
}

void cuda_backend::linear_backward_data(const tensor& dy, const tensor& w, const tensor& dx) {
  const std::int64_t n = dy.shape()[0], in = w.shape()[1], out = w.shape()[0];
  CLEAVE_ASSERT(dy.numel() == n * out && dx.numel() == n * in, "linear_backward_data shapes");
  const float *pdy = f32(*this, dy, "linear_backward_data: dy"), *pw = f32(*this, w, "linear_backward_data: w");
  float* pdx = f32(*this, dx, "linear_backward_data: dx");
  device_guard g(device_);
  gemm(pdy, pw, pdx, n, in, out, false, false, 1.0f, 0.0f);
}

void cuda_backend::linear_backward_weights(const tensor& x, const tensor& dy, const tensor& dw, const tensor& db) {
  const std::int64_t n = dy.shape()[0], in = dw.shape()[1], out = dw.shape()[0];
  CLEAVE_ASSERT(dy.numel() == n * out && x.numel() == n * in, "linear_backward_weights shapes");
  const float *px = f32(*this, x, "linear_backward_weights: x"), *pdy = f32(*this, dy, "linear_backward_weights: dy");
  float* pdw = f32(*this, dw, "linear_backward_weights: dw");
  device_guard g(device_);
  gemm(pdy, px, pdw, out, in, n, true, false, 1.0f, 1.0f);
  if (db.defined()) {
    CLEAVE_ASSERT(db.numel() == out, "linear_backward_weights: db size");
    CLEAVE_CHECK_CUDA(
        k::channel_sum_accumulate(pdy, f32(*this, db, "linear_backward_weights: db"), n, out, 1, stream_));
  }
}

// ---- pooling --------------------------------------------------------------------------------

namespace {

cuda_math::pool_geom pool_geometry(const core::pool2d_desc& d, const core::shape& xs, const core::shape& ys) {
  CLEAVE_ASSERT(xs.rank() == 4 && ys.rank() == 4 && xs[0] == ys[0] && xs[1] == ys[1], "pool2d shapes");
  CLEAVE_ASSERT(ys[2] == core::window_out(xs[2], d.kernel_h, d.stride_h, d.pad_h) &&
                    ys[3] == core::window_out(xs[3], d.kernel_w, d.stride_w, d.pad_w),
                "pool2d output size mismatch");
  CLEAVE_ASSERT(d.kernel_h > 0 && d.kernel_w > 0 && d.stride_h > 0 && d.stride_w > 0, "pool2d window");
  CLEAVE_ASSERT(xs[2] * xs[3] <= INT32_MAX, "pool2d plane too large for i32 argmax");
  return {xs[2], xs[3], ys[2], ys[3], d.kernel_h, d.kernel_w, d.stride_h, d.stride_w, d.pad_h, d.pad_w};
}

}  // namespace

void cuda_backend::pool2d_forward(const core::pool2d_desc& d, const tensor& x, const tensor& y, tensor* ws) {
  const auto geo = pool_geometry(d, x.shape(), y.shape());
  const std::int64_t planes = x.shape()[0] * x.shape()[1];
  const float* px = f32(*this, x, "pool2d_forward: x");
  float* py = f32(*this, y, "pool2d_forward: y");
  device_guard g(device_);
  if (d.kind == core::pool_kind::avg) {
    CLEAVE_CHECK_CUDA(k::avg_pool_forward(px, py, planes, geo, stream_));
    return;
  }
  std::int32_t* idx = nullptr;
  if (ws) {
    *ws = empty(y.shape(), core::dtype::i32);  // argmax as an offset into the (H,W) plane
    idx = static_cast<std::int32_t*>(raw(*ws));
  }
  CLEAVE_CHECK_CUDA(k::max_pool_forward(px, py, idx, planes, geo, stream_));
}

void cuda_backend::pool2d_backward(const core::pool2d_desc& d, const tensor& x, const tensor& dy, const tensor& ws,
                                   const tensor& dx) {
  const auto geo = pool_geometry(d, dx.shape(), dy.shape());
  const std::int64_t planes = dx.shape()[0] * dx.shape()[1];
  const float* pdy = f32(*this, dy, "pool2d_backward: dy");
  float* pdx = f32(*this, dx, "pool2d_backward: dx");
  device_guard g(device_);
  if (d.kind == core::pool_kind::avg) {
    CLEAVE_CHECK_CUDA(k::avg_pool_backward(pdy, pdx, planes, geo, stream_));
    return;
  }
  CLEAVE_ASSERT(ws.defined() && ws.dtype() == core::dtype::i32 && ws.numel() == dy.numel(),
                "max pool backward needs the forward workspace");
  expect_mine(*this, ws, "pool2d_backward: ws");
  CLEAVE_CHECK_CUDA(k::max_pool_backward(pdy, static_cast<const std::int32_t*>(raw(ws)), pdx, planes, geo, stream_));
}

// ---- batch norm -----------------------------------------------------------------------------

void cuda_backend::batchnorm_forward_train(const core::batchnorm_desc& d, const tensor& x, const tensor& gamma,
                                           const tensor& beta, const tensor& y, const tensor& save_mean,
                                           const tensor& save_invstd, const tensor& running_mean,
                                           const tensor& running_var) {
  const auto [n, c, hw] = split_nc(x);
  CLEAVE_ASSERT(c <= 65535, "batch norm: at most 65535 channels");
  same_numel(x, y, "batchnorm_forward_train");
  for (const tensor* t : {&gamma, &beta, &save_mean, &save_invstd, &running_mean, &running_var})
    CLEAVE_ASSERT(t->numel() == c, "batchnorm_forward_train: per-channel tensor size");
  const float *px = f32(*this, x, "batchnorm: x"), *pg = f32(*this, gamma, "batchnorm: gamma"),
              *pb = f32(*this, beta, "batchnorm: beta");
  float *py = f32(*this, y, "batchnorm: y"), *pm = f32(*this, save_mean, "batchnorm: save_mean"),
        *pi = f32(*this, save_invstd, "batchnorm: save_invstd"),
        *prm = f32(*this, running_mean, "batchnorm: running_mean"),
        *prv = f32(*this, running_var, "batchnorm: running_var");
  device_guard g(device_);
  auto ws = scratch(k::batchnorm_scratch_bytes(n, c, hw));
  CLEAVE_CHECK_CUDA(k::batchnorm_forward_train(px, pg, pb, py, pm, pi, prm, prv, n, c, hw, d.eps, d.momentum,
                                               static_cast<device_buffer*>(ws.get())->device_data(), stream_));
}

void cuda_backend::batchnorm_forward_infer(const core::batchnorm_desc& d, const tensor& x, const tensor& gamma,
                                           const tensor& beta, const tensor& running_mean, const tensor& running_var,
                                           const tensor& y) {
  const auto [n, c, hw] = split_nc(x);
  same_numel(x, y, "batchnorm_forward_infer");
  for (const tensor* t : {&gamma, &beta, &running_mean, &running_var})
    CLEAVE_ASSERT(t->numel() == c, "batchnorm_forward_infer: per-channel tensor size");
  const float *px = f32(*this, x, "batchnorm: x"), *pg = f32(*this, gamma, "batchnorm: gamma"),
              *pb = f32(*this, beta, "batchnorm: beta"), *prm = f32(*this, running_mean, "batchnorm: running_mean"),
              *prv = f32(*this, running_var, "batchnorm: running_var");
  float* py = f32(*this, y, "batchnorm: y");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::batchnorm_forward_infer(px, pg, pb, prm, prv, py, n, c, hw, d.eps, stream_));
}

void cuda_backend::batchnorm_backward(const core::batchnorm_desc&, const tensor& x, const tensor& dy,
                                      const tensor& gamma, const tensor& save_mean, const tensor& save_invstd,
                                      const tensor& dx, const tensor& dgamma, const tensor& dbeta) {
  const auto [n, c, hw] = split_nc(x);
  CLEAVE_ASSERT(c <= 65535, "batch norm: at most 65535 channels");
  same_numel(x, dy, "batchnorm_backward");
  same_numel(x, dx, "batchnorm_backward");
  for (const tensor* t : {&gamma, &save_mean, &save_invstd, &dgamma, &dbeta})
    CLEAVE_ASSERT(t->numel() == c, "batchnorm_backward: per-channel tensor size");
  const float *px = f32(*this, x, "batchnorm: x"), *pdy = f32(*this, dy, "batchnorm: dy"),
              *pg = f32(*this, gamma, "batchnorm: gamma"), *pm = f32(*this, save_mean, "batchnorm: save_mean"),
              *pi = f32(*this, save_invstd, "batchnorm: save_invstd");
  float *pdx = f32(*this, dx, "batchnorm: dx"), *pdg = f32(*this, dgamma, "batchnorm: dgamma"),
        *pdb = f32(*this, dbeta, "batchnorm: dbeta");
  device_guard g(device_);
  auto ws = scratch(k::batchnorm_scratch_bytes(n, c, hw));
  CLEAVE_CHECK_CUDA(k::batchnorm_backward(px, pdy, pg, pm, pi, pdx, pdg, pdb, n, c, hw,
                                          static_cast<device_buffer*>(ws.get())->device_data(), stream_));
}

// ---- loss -----------------------------------------------------------------------------------

void cuda_backend::softmax_xent_forward(const tensor& logits, const tensor& labels, const tensor& probs,
                                        const tensor& loss) {
  CLEAVE_ASSERT(logits.shape().rank() == 2, "softmax_xent: logits must be (N,K)");
  const std::int64_t n = logits.shape()[0], kk = logits.shape()[1];
  CLEAVE_ASSERT(labels.dtype() == core::dtype::i32 && labels.numel() == n, "softmax_xent: labels must be (N) i32");
  same_numel(logits, probs, "softmax_xent_forward");
  CLEAVE_ASSERT(loss.numel() == 1, "softmax_xent: loss must be (1)");
  expect_mine(*this, labels, "softmax_xent: labels");
  const float* pl = f32(*this, logits, "softmax_xent: logits");
  float *pp = f32(*this, probs, "softmax_xent: probs"), *ploss = f32(*this, loss, "softmax_xent: loss");
  device_guard g(device_);
  auto ws = scratch(k::softmax_xent_scratch_bytes(n));
  CLEAVE_CHECK_CUDA(k::softmax_xent_forward(pl, static_cast<const std::int32_t*>(raw(labels)), pp, ploss, n, kk,
                                            static_cast<device_buffer*>(ws.get())->device_data(), stream_));
}

void cuda_backend::softmax_xent_backward(const tensor& probs, const tensor& labels, const tensor& dlogits,
                                         float scale) {
  CLEAVE_ASSERT(probs.shape().rank() == 2, "softmax_xent: probs must be (N,K)");
  const std::int64_t n = probs.shape()[0], kk = probs.shape()[1];
  CLEAVE_ASSERT(labels.dtype() == core::dtype::i32 && labels.numel() == n, "softmax_xent: labels must be (N) i32");
  same_numel(probs, dlogits, "softmax_xent_backward");
  expect_mine(*this, labels, "softmax_xent: labels");
  const float* pp = f32(*this, probs, "softmax_xent: probs");
  float* pd = f32(*this, dlogits, "softmax_xent: dlogits");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::softmax_xent_backward(pp, static_cast<const std::int32_t*>(raw(labels)), pd, n, kk,
                                             scale / static_cast<float>(n), stream_));
}

// ---- optimizers -----------------------------------------------------------------------------

void cuda_backend::sgd_update(const core::sgd_desc& d, const tensor& param, const tensor& grad,
                              const tensor& momentum_buf) {
  same_numel(param, grad, "sgd_update");
  float* p = f32(*this, param, "sgd_update: param");
  const float* gr = f32(*this, grad, "sgd_update: grad");
  float* buf = nullptr;
  if (d.momentum != 0.0f) {
    same_numel(param, momentum_buf, "sgd_update");
    buf = f32(*this, momentum_buf, "sgd_update: momentum_buf");
  }
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::sgd_update(p, gr, buf, param.numel(), {d.lr, d.momentum, d.weight_decay, d.nesterov}, stream_));
}

void cuda_backend::adamw_update(const core::adamw_desc& d, const tensor& param, const tensor& grad, const tensor& m,
                                const tensor& v) {
  same_numel(param, grad, "adamw_update");
  same_numel(param, m, "adamw_update");
  same_numel(param, v, "adamw_update");
  float *p = f32(*this, param, "adamw_update: param"), *pm = f32(*this, m, "adamw_update: m"),
        *pv = f32(*this, v, "adamw_update: v");
  const float* gr = f32(*this, grad, "adamw_update: grad");
  // Bias corrections in double on the host, as the reference computes them.
  const double bc1 = 1.0 - std::pow(static_cast<double>(d.beta1), static_cast<double>(d.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(d.beta2), static_cast<double>(d.step));
  const cuda_math::adamw_params a{d.beta1,
                                  d.beta2,
                                  d.eps,
                                  1.0f - d.lr * d.weight_decay,
                                  static_cast<float>(d.lr / bc1),
                                  static_cast<float>(std::sqrt(bc2))};
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::adamw_update(p, gr, pm, pv, param.numel(), a, stream_));
}

}  // namespace cleave::backend::detail
