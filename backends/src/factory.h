// How each backend plugs into the registry: one probe and one constructor per backend.
#pragma once

#include <memory>
#include <string>

#include "cleave/backend/registry.h"

namespace cleave::backend::detail {

// Each returns what list_backends() reports for it.
backend_info probe_reference();
std::unique_ptr<core::backend> create_reference(const std::string& device);
#ifdef CLEAVE_HAVE_ONEDNN
backend_info probe_onednn();
std::unique_ptr<core::backend> create_onednn(const std::string& device);
#endif
#ifdef CLEAVE_HAVE_VULKAN
backend_info probe_vulkan();
std::unique_ptr<core::backend> create_vulkan(const std::string& device);
#endif
#ifdef CLEAVE_HAVE_CUDA
backend_info probe_cuda();
std::unique_ptr<core::backend> create_cuda(const std::string& device);
#endif

}  // namespace cleave::backend::detail
