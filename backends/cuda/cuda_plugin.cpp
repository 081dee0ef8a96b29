// The CUDA backend as a plugin (libcleave-cuda.so): the registry loads it only when a CUDA
// backend is asked for on a machine with an NVIDIA driver, so that processes without one (device
// agents, edges, `cleave certs`) never pay for initialising cuBLAS and cuDNN. Its two entry
// points are the only symbols it exports; errors travel as text.
#include <exception>
#include <string>

#include "factory.h"

extern "C" __attribute__((visibility("default"))) void cleave_cuda_probe(cleave::backend::backend_info* out) {
  try {
    *out = cleave::backend::detail::probe_cuda();
  } catch (const std::exception& e) {
    out->available = false;
    out->detail = e.what();
  }
}

extern "C" __attribute__((visibility("default"))) cleave::core::backend* cleave_cuda_create(const char* device,
                                                                                            std::string* error) {
  try {
    return cleave::backend::detail::create_cuda(device).release();
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}
