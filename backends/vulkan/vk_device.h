// Vulkan instance, physical-device selection and the logical device shared by every vulkan
// backend object on the same GPU in a process (queue, memory types, limits, pipelines).
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cleave::backend::vk {

struct physical_device {
  VkPhysicalDevice handle = VK_NULL_HANDLE;
  std::uint32_t index = 0;  // position in vkEnumeratePhysicalDevices order: "vulkan:<index>"
  std::string name;
  VkPhysicalDeviceType type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  std::uint32_t compute_family = 0;  // a queue family with compute support
};

// "discrete GPU", "integrated GPU", "virtual GPU", "CPU", "other"
const char* device_type_name(VkPhysicalDeviceType t);
// A hardware GPU (discrete, integrated or virtual), not a CPU implementation such as lavapipe.
bool is_real_gpu(VkPhysicalDeviceType t);

// The process-wide Vulkan instance. CLEAVE_VK_VALIDATION=1 enables the Khronos validation
// layer (when installed) and counts its messages.
class instance {
 public:
  // Creates the instance on first use; throws core::error when vkCreateInstance fails.
  static std::shared_ptr<instance> get();
  ~instance();
  instance(const instance&) = delete;
  instance& operator=(const instance&) = delete;

  VkInstance handle() const { return instance_; }
  // Devices that have a compute queue, in enumeration order.
  const std::vector<physical_device>& devices() const { return devices_; }
  bool validation() const { return validation_; }

 private:
  instance() = default;
  void create();

  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  bool validation_ = false;
  std::vector<physical_device> devices_;
};

// Validation-layer warnings and errors reported in this process so far.
std::uint64_t validation_message_count();

// The device a spec names: "" = the preferred one (discrete GPU, then integrated, then virtual,
// then others, then CPU; lowest index first), digits = enumeration index, anything else = a
// case-insensitive substring of the device name. Throws core::error listing the devices.
const physical_device& select_device(const std::vector<physical_device>& all, const std::string& spec);

struct pipeline {
  VkPipeline handle = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  std::uint32_t n_bindings = 0;
};

// Every pipeline layout reserves this many bytes of push constants (the guaranteed minimum).
inline constexpr std::uint32_t push_constant_bytes = 128;

// A logical device with one compute queue. Backend objects on the same physical device share
// it: its pipelines are compiled once per process, and queue submission is serialised here.
class device {
 public:
  // The shared device for `spec` (see select_device); created on first use.
  static std::shared_ptr<device> get(const std::string& spec);
  ~device();
  device(const device&) = delete;
  device& operator=(const device&) = delete;

  VkDevice handle() const { return device_; }
  const physical_device& physical() const { return phys_; }
  const VkPhysicalDeviceLimits& limits() const { return props_.limits; }
  std::uint32_t queue_family() const { return phys_.compute_family; }
  bool validation() const { return instance_->validation(); }
  // Largest single allocation the device accepts.
  VkDeviceSize max_allocation() const { return max_allocation_; }

  // Memory type for tensors (device-local), and whether it is host-visible and coherent (then
  // uploads and downloads map it directly: integrated GPUs, CPU devices).
  std::uint32_t tensor_memory_type() const { return tensor_type_; }
  bool tensor_memory_mappable() const { return tensor_mappable_; }
  // Host-visible coherent memory for staging (cached when the device offers it).
  std::uint32_t staging_memory_type() const { return staging_type_; }

  void submit(const VkSubmitInfo& info, VkFence fence);

  // The compute pipeline of shaders/<shader>.comp with the given specialization constants
  // (constant_id i = spec[i]); compiled on first use and cached.
  const pipeline& get_pipeline(std::string_view shader, std::uint32_t n_bindings,
                               std::span<const std::uint32_t> spec = {});
  std::size_t n_pipelines() const;

 private:
  explicit device(std::shared_ptr<instance> inst, const physical_device& phys);
  VkDescriptorSetLayout set_layout(std::uint32_t n_bindings);

  std::shared_ptr<instance> instance_;
  physical_device phys_;
  VkPhysicalDeviceProperties props_{};
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  std::mutex queue_mutex_;
  VkDeviceSize max_allocation_ = 0;
  std::uint32_t tensor_type_ = 0, staging_type_ = 0;
  bool tensor_mappable_ = false;

  mutable std::mutex pipelines_mutex_;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  std::map<std::uint32_t, std::pair<VkDescriptorSetLayout, VkPipelineLayout>> layouts_;
  std::map<std::string, VkShaderModule> modules_;
  std::map<std::string, std::unique_ptr<pipeline>> pipelines_;
};

}  // namespace cleave::backend::vk
