// The CUDA backend: core::backend on one NVIDIA GPU, with cuBLAS for dense products, cuDNN for
// convolutions and own kernels for the rest, all work queued on one stream per backend.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cleave/core/backend.h"
#include "cuda_memory.h"

namespace cleave::backend::detail {

// What "cuda[:index][:tf32]" asks for.
struct cuda_spec {
  int device = 0;
  bool tf32 = false;  // allow TF32 tensor cores in cuBLAS and cuDNN (off: full f32 products)
};

// Parses the part after "cuda:" ("", "1", "tf32", "0:tf32"); CLEAVE_CUDA_TF32=1 in the
// environment also allows TF32. Throws core::error on anything else.
cuda_spec parse_cuda_spec(const std::string& device);

class cuda_backend final : public core::backend {
 public:
  explicit cuda_backend(const cuda_spec& spec);
  ~cuda_backend() override;
  cuda_backend(const cuda_backend&) = delete;
  cuda_backend& operator=(const cuda_backend&) = delete;

  std::string name() const override { return "cuda"; }
  std::string device_name() const override { return device_name_; }
  bool host_memory() const override { return false; }

  core::buffer_ptr allocate(std::size_t bytes) override;
  void upload(const core::tensor& dst, const void* src) override;
  void download(const core::tensor& src, void* dst) override;
  void synchronize() override;

  void fill(const core::tensor& t, float value) override;
  void copy(const core::tensor& src, const core::tensor& dst) override;
  void cast(const core::tensor& src, const core::tensor& dst) override;
  void add(const core::tensor& a, const core::tensor& b, const core::tensor& y) override;
  void mul(const core::tensor& a, const core::tensor& b, const core::tensor& y) override;
  void axpy(float alpha, const core::tensor& x, const core::tensor& y) override;
  void scale(const core::tensor& y, float alpha) override;

  void relu_forward(const core::tensor& x, const core::tensor& y) override;
  void relu_backward(const core::tensor& y, const core::tensor& dy, const core::tensor& dx) override;
  void dropout_forward(const core::tensor& x, const core::tensor& y, const core::tensor& mask, float p,
                       std::uint32_t seed) override;

  void matmul(const core::tensor& a, const core::tensor& b, const core::tensor& c, bool trans_a, bool trans_b,
              float alpha, float beta) override;
  void linear_forward(const core::tensor& x, const core::tensor& w, const core::tensor& b,
                      const core::tensor& y) override;
  void linear_backward_data(const core::tensor& dy, const core::tensor& w, const core::tensor& dx) override;
  void linear_backward_weights(const core::tensor& x, const core::tensor& dy, const core::tensor& dw,
                               const core::tensor& db) override;

  void conv2d_forward(const core::conv2d_desc& d, const core::tensor& x, const core::tensor& w, const core::tensor& b,
                      const core::tensor& y) override;
  void conv2d_backward_data(const core::conv2d_desc& d, const core::tensor& dy, const core::tensor& w,
                            const core::tensor& dx) override;
  void conv2d_backward_weights(const core::conv2d_desc& d, const core::tensor& x, const core::tensor& dy,
                               const core::tensor& dw, const core::tensor& db) override;

  void pool2d_forward(const core::pool2d_desc& d, const core::tensor& x, const core::tensor& y,
                      core::tensor* ws) override;
  void pool2d_backward(const core::pool2d_desc& d, const core::tensor& x, const core::tensor& dy,
                       const core::tensor& ws, const core::tensor& dx) override;

  void batchnorm_forward_train(const core::batchnorm_desc& d, const core::tensor& x, const core::tensor& gamma,
                               const core::tensor& beta, const core::tensor& y, const core::tensor& save_mean,
                               const core::tensor& save_invstd, const core::tensor& running_mean,
                               const core::tensor& running_var) override;
  void batchnorm_forward_infer(const core::batchnorm_desc& d, const core::tensor& x, const core::tensor& gamma,
                               const core::tensor& beta, const core::tensor& running_mean,
                               const core::tensor& running_var, const core::tensor& y) override;
  void batchnorm_backward(const core::batchnorm_desc& d, const core::tensor& x, const core::tensor& dy,
                          const core::tensor& gamma, const core::tensor& save_mean, const core::tensor& save_invstd,
                          const core::tensor& dx, const core::tensor& dgamma, const core::tensor& dbeta) override;

  void softmax_xent_forward(const core::tensor& logits, const core::tensor& labels, const core::tensor& probs,
                            const core::tensor& loss) override;
  void softmax_xent_backward(const core::tensor& probs, const core::tensor& labels, const core::tensor& dlogits,
                             float scale) override;

  void sgd_update(const core::sgd_desc& d, const core::tensor& param, const core::tensor& grad,
                  const core::tensor& momentum_buf) override;
  void adamw_update(const core::adamw_desc& d, const core::tensor& param, const core::tensor& grad,
                    const core::tensor& m, const core::tensor& v) override;

  // ---- CUDA specifics (tests and benchmarks) ----
  int device() const { return device_; }
  bool tf32() const { return tf32_; }
  cudaStream_t stream() const { return stream_; }
  device_allocator::stats memory_stats() const { return alloc_->get_stats(); }
  std::size_t n_conv_plans() const { return conv_plans_.size(); }

 private:
  // cuDNN descriptors and chosen algorithms of one convolution shape (cuda_conv.cpp).
  struct conv_plan {
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    // One convolution descriptor per direction, all with the math type conv_math() gives.
    cudnnConvolutionDescriptor_t fwd_desc = nullptr, data_desc = nullptr, filter_desc = nullptr;
    // Candidate algorithms per direction, fastest first (empty until first use). Under FMA
    // math a candidate cuDNN then refuses (NOT_SUPPORTED) is dropped and the next one tried.
    std::vector<cudnnConvolutionFwdAlgo_t> fwd_algos;
    std::vector<cudnnConvolutionBwdDataAlgo_t> data_algos;
    std::vector<cudnnConvolutionBwdFilterAlgo_t> filter_algos;
    conv_plan() = default;
    ~conv_plan();
    conv_plan(const conv_plan&) = delete;
    conv_plan& operator=(const conv_plan&) = delete;
  };
  using conv_key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                              std::int64_t, int, int, int, int>;

  // Device memory for one op's temporary use; returned to the cache when the op is done
  // (later reuse is ordered after this op's kernels on the stream).
  core::buffer_ptr scratch(std::size_t bytes) { return allocate(bytes); }
  void gemm(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a,
            bool trans_b, float alpha, float beta);
  conv_plan& plan_for(const core::conv2d_desc& d, const core::tensor& x, const core::tensor& w, const core::tensor& y);

  int device_ = 0;
  bool tf32_ = false;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  std::shared_ptr<device_allocator> alloc_;
  pinned_staging staging_;
  std::map<conv_key, std::unique_ptr<conv_plan>> conv_plans_;
};

}  // namespace cleave::backend::detail
