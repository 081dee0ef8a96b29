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

#include "cleave/backend/ops_override.h"
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

  CLEAVE_BACKEND_COMPUTE_OPS_OVERRIDE
  CLEAVE_BACKEND_CODEC_OPS_OVERRIDE

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
                              std::int64_t, int, int, int, int, int>;

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
