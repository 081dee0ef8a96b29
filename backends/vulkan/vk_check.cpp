// Names of Vulkan result codes for error messages.
#include "vk_check.h"

namespace cleave::backend::vk {

std::string result_name(VkResult r) {
  const char* n = "VK_RESULT_UNKNOWN";
  switch (r) {
#define CLEAVE_VK_CASE(x) \
  case x:                 \
    n = #x;               \
    break
    CLEAVE_VK_CASE(VK_SUCCESS);
    CLEAVE_VK_CASE(VK_NOT_READY);
    CLEAVE_VK_CASE(VK_TIMEOUT);
    CLEAVE_VK_CASE(VK_INCOMPLETE);
    CLEAVE_VK_CASE(VK_ERROR_OUT_OF_HOST_MEMORY);
    CLEAVE_VK_CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY);
    CLEAVE_VK_CASE(VK_ERROR_INITIALIZATION_FAILED);
    CLEAVE_VK_CASE(VK_ERROR_DEVICE_LOST);
    CLEAVE_VK_CASE(VK_ERROR_MEMORY_MAP_FAILED);
    CLEAVE_VK_CASE(VK_ERROR_LAYER_NOT_PRESENT);
    CLEAVE_VK_CASE(VK_ERROR_EXTENSION_NOT_PRESENT);
    CLEAVE_VK_CASE(VK_ERROR_FEATURE_NOT_PRESENT);
    CLEAVE_VK_CASE(VK_ERROR_INCOMPATIBLE_DRIVER);
    CLEAVE_VK_CASE(VK_ERROR_TOO_MANY_OBJECTS);
    CLEAVE_VK_CASE(VK_ERROR_FORMAT_NOT_SUPPORTED);
    CLEAVE_VK_CASE(VK_ERROR_FRAGMENTED_POOL);
    CLEAVE_VK_CASE(VK_ERROR_OUT_OF_POOL_MEMORY);
    CLEAVE_VK_CASE(VK_ERROR_INVALID_EXTERNAL_HANDLE);
    CLEAVE_VK_CASE(VK_ERROR_FRAGMENTATION);
    CLEAVE_VK_CASE(VK_ERROR_UNKNOWN);
#undef CLEAVE_VK_CASE
    default:
      break;
  }
  return std::string(n) + " (" + std::to_string(static_cast<int>(r)) + ")";
}

void throw_vk_error(const char* expr, VkResult r, const char* file, int line) {
  std::string where(file);
  if (const auto slash = where.find_last_of('/'); slash != std::string::npos) where = where.substr(slash + 1);
  throw core::error("vulkan: " + std::string(expr) + " failed: " + result_name(r) + " at " + where + ":" +
                    std::to_string(line));
}

}  // namespace cleave::backend::vk
