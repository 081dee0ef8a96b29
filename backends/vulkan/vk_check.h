// Error handling for Vulkan calls: CLEAVE_CHECK_VK throws core::error naming the failing call
// and its VkResult, so a driver failure aborts the operation with a message a user can act on.
#pragma once

#include <vulkan/vulkan.h>

#include <string>

#include "cleave/core/error.h"

namespace cleave::backend::vk {

// "VK_ERROR_OUT_OF_DEVICE_MEMORY (-2)"
std::string result_name(VkResult r);

[[noreturn]] void throw_vk_error(const char* expr, VkResult r, const char* file, int line);

}  // namespace cleave::backend::vk

#define CLEAVE_CHECK_VK(expr)                                                              \
  do {                                                                                     \
    const VkResult cleave_vk_result_ = (expr);                                             \
    if (cleave_vk_result_ != VK_SUCCESS)                                                   \
      ::cleave::backend::vk::throw_vk_error(#expr, cleave_vk_result_, __FILE__, __LINE__); \
  } while (0)
