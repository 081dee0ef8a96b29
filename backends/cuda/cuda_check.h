// Error checks for CUDA runtime, cuBLAS and cuDNN calls: a failure throws core::error naming the
// failing call, the vendor's error name and text, and where it was made.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>

namespace cleave::backend::detail {

[[noreturn]] void throw_cuda(const char* call, cudaError_t e, const char* file, int line);
[[noreturn]] void throw_cublas(const char* call, cublasStatus_t s, const char* file, int line);
[[noreturn]] void throw_cudnn(const char* call, cudnnStatus_t s, const char* file, int line);

}  // namespace cleave::backend::detail

#define CLEAVE_CHECK_CUDA(expr)                                                                                \
  do {                                                                                                         \
    const cudaError_t cleave_e_ = (expr);                                                                      \
    if (cleave_e_ != cudaSuccess) ::cleave::backend::detail::throw_cuda(#expr, cleave_e_, __FILE__, __LINE__); \
  } while (0)

#define CLEAVE_CHECK_CUBLAS(expr)                                                    \
  do {                                                                               \
    const cublasStatus_t cleave_s_ = (expr);                                         \
    if (cleave_s_ != CUBLAS_STATUS_SUCCESS)                                          \
      ::cleave::backend::detail::throw_cublas(#expr, cleave_s_, __FILE__, __LINE__); \
  } while (0)

#define CLEAVE_CHECK_CUDNN(expr)                                                    \
  do {                                                                              \
    const cudnnStatus_t cleave_s_ = (expr);                                         \
    if (cleave_s_ != CUDNN_STATUS_SUCCESS)                                          \
      ::cleave::backend::detail::throw_cudnn(#expr, cleave_s_, __FILE__, __LINE__); \
  } while (0)
