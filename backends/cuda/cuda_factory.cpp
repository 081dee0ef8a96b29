// How the CUDA backend plugs into the registry: the probe (is a usable GPU there, and if not,
// the driver's reason), device-spec parsing, construction, and the vendor error messages.
#include <cstdlib>
#include <string>

#include "cleave/core/error.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "factory.h"

namespace cleave::backend::detail {

namespace {

std::string where(const char* file, int line) {
  std::string f(file);
  if (const auto slash = f.find_last_of('/'); slash != std::string::npos) f = f.substr(slash + 1);
  return " (" + f + ":" + std::to_string(line) + ")";
}

std::string cuda_reason(cudaError_t e) {
  return std::string(cudaGetErrorString(e)) + " [" + cudaGetErrorName(e) + " " + std::to_string(static_cast<int>(e)) +
         "]";
}

}  // namespace

void throw_cuda(const char* call, cudaError_t e, const char* file, int line) {
  throw core::error(std::string("cuda: ") + call + " failed: " + cuda_reason(e) + where(file, line));
}

void throw_cublas(const char* call, cublasStatus_t s, const char* file, int line) {
  throw core::error(std::string("cuda: ") + call + " failed: " + cublasGetStatusName(s) + ": " +
                    cublasGetStatusString(s) + where(file, line));
}

void throw_cudnn(const char* call, cudnnStatus_t s, const char* file, int line) {
  throw core::error(std::string("cuda: ") + call + " failed: " + cudnnGetErrorString(s) + where(file, line));
}

cuda_spec parse_cuda_spec(const std::string& device) {
  cuda_spec spec;
  if (const char* env = std::getenv("CLEAVE_CUDA_TF32"); env && std::string(env) == "1") spec.tf32 = true;
  bool have_index = false;
  std::size_t pos = 0;
  while (pos <= device.size() && !device.empty()) {
    const std::size_t colon = device.find(':', pos);
    const std::string part = device.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    if (part == "tf32") {
      spec.tf32 = true;
    } else if (!part.empty() && !have_index && part.size() <= 4 &&
               part.find_first_not_of("0123456789") == std::string::npos) {
      spec.device = std::stoi(part);
      have_index = true;
    } else {
      throw core::error("backend 'cuda': bad device '" + device +
                        "' (expected cuda[:index][:tf32], e.g. cuda:0 or cuda:1:tf32)");
    }
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return spec;
}

backend_info probe_cuda() {
  backend_info info;
  info.name = "cuda";
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    info.detail = "no usable CUDA driver: " + cuda_reason(e);
    return info;
  }
  if (n == 0) {
    info.detail = "no CUDA device found";
    return info;
  }
  cudaDeviceProp prop{};
  if (const cudaError_t pe = cudaGetDeviceProperties(&prop, 0); pe != cudaSuccess) {
    info.detail = "cudaGetDeviceProperties failed: " + cuda_reason(pe);
    return info;
  }
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(0);
  const cudaError_t ie = cuda_kernels::check_kernel_image();
  cudaSetDevice(prev);
  const std::string sm = "sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
  if (ie != cudaSuccess) {
    cudaGetLastError();
    info.detail = std::string(prop.name) + " (" + sm + ") cannot run this build's kernels: " + cuda_reason(ie);
    return info;
  }
  info.available = true;
  info.real_gpu = true;
  info.detail = std::string(prop.name) + " (" + sm + ", " + std::to_string(prop.totalGlobalMem >> 20) + " MiB" +
                (n > 1 ? ", " + std::to_string(n) + " devices" : "") + ")";
  return info;
}

std::unique_ptr<core::backend> create_cuda(const std::string& device) {
  return std::make_unique<cuda_backend>(parse_cuda_spec(device));
}

}  // namespace cleave::backend::detail
