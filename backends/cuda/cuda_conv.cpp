// CUDA backend: 2-D convolutions through cuDNN (legacy convolution API). Descriptors and the
// algorithms of each direction are chosen once per shape (cudnnFind*, measured) and cached.
#include <string>
#include <vector>

#include "cleave/core/error.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_tensor.h"

namespace cleave::backend::detail {

using core::tensor;

namespace {

using core::conv_dims;

// The sizes, within what cuDNN's 32-bit descriptors take.
conv_dims conv_shapes(const core::conv2d_desc& d, const tensor& x, const tensor& w, const tensor& y) {
  const conv_dims c = core::conv_dims_of(d, x, w, y);
  for (std::int64_t v : {c.n, c.c, c.h, c.w, c.k, c.r, c.s})
    CLEAVE_ASSERT(v > 0 && v <= INT32_MAX, "conv2d dimension out of cuDNN's range");
  return c;
}

int i32(std::int64_t v) {
  return static_cast<int>(v);
}

// FMA only (true f32 products) unless TF32 is allowed; DEFAULT permits TF32 tensor cores on
// Ampere and later. The descriptor's math type binds every algorithm run with it.
cudnnMathType_t conv_math(bool tf32) {
  return tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// Measured results that succeeded, fastest first, then `general` (works for every shape).
template <class Perf, class Algo>
std::vector<Algo> candidates(const std::vector<Perf>& results, int n, Algo general) {
  std::vector<Algo> out;
  for (int i = 0; i < n; ++i) {
    const Perf& r = results[static_cast<std::size_t>(i)];
    if (r.status == CUDNN_STATUS_SUCCESS) out.push_back(r.algo);
  }
  out.push_back(general);
  return out;
}

// Runs `run(algo)` with the first candidate cuDNN accepts; drops those it refuses as not
// supported (an algorithm measured under another math type than the descriptor's).
template <class Algo, class Run>
void run_first_supported(std::vector<Algo>& algos, const char* what, Run run) {
  while (!algos.empty()) {
    const cudnnStatus_t s = run(algos.front());
    if (s == CUDNN_STATUS_SUCCESS) return;
    // cuDNN 9 reports refusals as CUDNN_STATUS_NOT_SUPPORTED (3000) or one of its 30xx sub-codes.
    const bool refused = s / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000;
    if (!refused || algos.size() == 1) throw_cudnn(what, s, __FILE__, __LINE__);
    algos.erase(algos.begin());
  }
}

void* dev(const core::buffer_ptr& b) {
  return b ? static_cast<device_buffer*>(b.get())->device_data() : nullptr;
}

}  // namespace

cuda_backend::conv_plan::~conv_plan() {
  if (x) cudnnDestroyTensorDescriptor(x);
  if (y) cudnnDestroyTensorDescriptor(y);
  if (w) cudnnDestroyFilterDescriptor(w);
  for (auto* d : {fwd_desc, data_desc, filter_desc})
    if (d) cudnnDestroyConvolutionDescriptor(d);
}

cuda_backend::conv_plan& cuda_backend::plan_for(const core::conv2d_desc& d, const tensor& x, const tensor& w,
                                                const tensor& y) {
  const conv_dims c = conv_shapes(d, x, w, y);
  const conv_key key{c.n, c.c, c.h, c.w, c.k, c.r, c.s, d.stride_h, d.stride_w, d.pad_h, d.pad_w, d.groups};
  if (auto it = conv_plans_.find(key); it != conv_plans_.end()) return *it->second;
  auto plan = std::make_unique<conv_plan>();
  CLEAVE_CHECK_CUDNN(cudnnCreateTensorDescriptor(&plan->x));
  CLEAVE_CHECK_CUDNN(cudnnCreateTensorDescriptor(&plan->y));
  CLEAVE_CHECK_CUDNN(cudnnCreateFilterDescriptor(&plan->w));
  CLEAVE_CHECK_CUDNN(
      cudnnSetTensor4dDescriptor(plan->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, i32(c.n), i32(c.c), i32(c.h), i32(c.w)));
  CLEAVE_CHECK_CUDNN(
      cudnnSetTensor4dDescriptor(plan->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, i32(c.n), i32(c.k), i32(c.p), i32(c.q)));
  CLEAVE_CHECK_CUDNN(cudnnSetFilter4dDescriptor(plan->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, i32(c.k), i32(c.cg()),
                                                i32(c.r), i32(c.s)));
  for (auto* desc : {&plan->fwd_desc, &plan->data_desc, &plan->filter_desc}) {
    CLEAVE_CHECK_CUDNN(cudnnCreateConvolutionDescriptor(desc));
    // Cross-correlation (no kernel flip), as the reference computes.
    CLEAVE_CHECK_CUDNN(cudnnSetConvolution2dDescriptor(*desc, d.pad_h, d.pad_w, d.stride_h, d.stride_w, 1, 1,
                                                       CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CLEAVE_CHECK_CUDNN(cudnnSetConvolutionMathType(*desc, conv_math(tf32_)));
    if (c.g > 1) CLEAVE_CHECK_CUDNN(cudnnSetConvolutionGroupCount(*desc, i32(c.g)));
  }
  int p = 0, q = 0, nn = 0, kk = 0;
  CLEAVE_CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(plan->fwd_desc, plan->x, plan->w, &nn, &kk, &p, &q));
  CLEAVE_ASSERT(p == c.p && q == c.q, "cuDNN disagrees on the convolution output size");
  return *conv_plans_.emplace(key, std::move(plan)).first->second;
}

void cuda_backend::conv2d_forward(const core::conv2d_desc& d, const tensor& x, const tensor& w, const tensor& b,
                                  const tensor& y) {
  const float *px = f32(*this, x, "conv2d_forward: x"), *pw = f32(*this, w, "conv2d_forward: w");
  float* py = f32(*this, y, "conv2d_forward: y");
  device_guard g(device_);
  conv_plan& pl = plan_for(d, x, w, y);
  if (pl.fwd_algos.empty()) {
    std::vector<cudnnConvolutionFwdAlgoPerf_t> res(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
    int n = 0;
    CLEAVE_CHECK_CUDNN(cudnnFindConvolutionForwardAlgorithm(cudnn_, pl.x, pl.w, pl.fwd_desc, pl.y,
                                                            CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, res.data()));
    pl.fwd_algos = candidates(res, n, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
  }
  run_first_supported(pl.fwd_algos, "cudnnConvolutionForward", [&](cudnnConvolutionFwdAlgo_t algo) {
    std::size_t bytes = 0;
    CLEAVE_CHECK_CUDNN(cudnnGetConvolutionForwardWorkspaceSize(cudnn_, pl.x, pl.w, pl.fwd_desc, pl.y, algo, &bytes));
    auto ws = bytes ? scratch(bytes) : core::buffer_ptr{};
    const float one = 1.0f, zero = 0.0f;
    return cudnnConvolutionForward(cudnn_, &one, pl.x, px, pl.w, pw, pl.fwd_desc, algo, dev(ws), bytes, &zero, pl.y,
                                   py);
  });
  if (b.defined()) {
    const auto& ys = y.shape();
    CLEAVE_ASSERT(b.numel() == ys[1], "conv2d_forward: bias size");
    CLEAVE_CHECK_CUDA(
        cuda_kernels::add_channel_bias(f32(*this, b, "conv2d_forward: b"), py, ys[0], ys[1], ys[2] * ys[3], stream_));
  }
}

void cuda_backend::conv2d_backward_data(const core::conv2d_desc& d, const tensor& dy, const tensor& w,
                                        const tensor& dx) {
  const float *pdy = f32(*this, dy, "conv2d_backward_data: dy"), *pw = f32(*this, w, "conv2d_backward_data: w");
  float* pdx = f32(*this, dx, "conv2d_backward_data: dx");
  device_guard g(device_);
  conv_plan& pl = plan_for(d, dx, w, dy);
  if (pl.data_algos.empty()) {
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> res(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
    int n = 0;
    CLEAVE_CHECK_CUDNN(cudnnFindConvolutionBackwardDataAlgorithm(
        cudnn_, pl.w, pl.y, pl.data_desc, pl.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, res.data()));
    pl.data_algos = candidates(res, n, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
  }
  run_first_supported(pl.data_algos, "cudnnConvolutionBackwardData", [&](cudnnConvolutionBwdDataAlgo_t algo) {
    std::size_t bytes = 0;
    CLEAVE_CHECK_CUDNN(
        cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn_, pl.w, pl.y, pl.data_desc, pl.x, algo, &bytes));
    auto ws = bytes ? scratch(bytes) : core::buffer_ptr{};
    const float one = 1.0f, zero = 0.0f;
    return cudnnConvolutionBackwardData(cudnn_, &one, pl.w, pw, pl.y, pdy, pl.data_desc, algo, dev(ws), bytes, &zero,
                                        pl.x, pdx);
  });
}

void cuda_backend::conv2d_backward_weights(const core::conv2d_desc& d, const tensor& x, const tensor& dy,
                                           const tensor& dw, const tensor& db) {
  const float *px = f32(*this, x, "conv2d_backward_weights: x"), *pdy = f32(*this, dy, "conv2d_backward_weights: dy");
  float* pdw = f32(*this, dw, "conv2d_backward_weights: dw");
  device_guard g(device_);
  conv_plan& pl = plan_for(d, x, dw, dy);
  if (pl.filter_algos.empty()) {
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> res(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
    int n = 0;
    // Measures on buffers cuDNN allocates itself, so dw (an accumulator) is not disturbed.
    CLEAVE_CHECK_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithm(
        cudnn_, pl.x, pl.y, pl.filter_desc, pl.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, res.data()));
    pl.filter_algos = candidates(res, n, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
  }
  run_first_supported(pl.filter_algos, "cudnnConvolutionBackwardFilter", [&](cudnnConvolutionBwdFilterAlgo_t algo) {
    std::size_t bytes = 0;
    CLEAVE_CHECK_CUDNN(
        cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn_, pl.x, pl.y, pl.filter_desc, pl.w, algo, &bytes));
    auto ws = bytes ? scratch(bytes) : core::buffer_ptr{};
    const float one = 1.0f;  // beta = 1: dw += correlation(x, dy)
    return cudnnConvolutionBackwardFilter(cudnn_, &one, pl.x, px, pl.y, pdy, pl.filter_desc, algo, dev(ws), bytes, &one,
                                          pl.w, pdw);
  });
  if (db.defined()) {
    const auto& ys = dy.shape();
    CLEAVE_ASSERT(db.numel() == ys[1], "conv2d_backward_weights: db size");
    CLEAVE_CHECK_CUDA(cuda_kernels::channel_sum_accumulate(pdy, f32(*this, db, "conv2d_backward_weights: db"), ys[0],
                                                           ys[1], ys[2] * ys[3], stream_));
  }
}

}  // namespace cleave::backend::detail
