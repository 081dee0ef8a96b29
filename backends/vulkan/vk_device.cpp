// Vulkan instance creation (with optional validation), device listing and selection, the shared
// logical device, and the pipeline cache.
#include "vk_device.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cleave/core/error.h"
#include "vk_check.h"
#include "vk_shaders.h"

namespace cleave::backend::vk {

namespace {

std::atomic<std::uint64_t> g_validation_messages{0};

VKAPI_ATTR VkBool32 VKAPI_CALL on_debug_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                VkDebugUtilsMessageTypeFlagsEXT type,
                                                const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
  if ((type & VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT) &&
      (severity & (VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)))
    g_validation_messages.fetch_add(1);
  std::fprintf(stderr, "cleave vulkan debug: %s\n", data && data->pMessage ? data->pMessage : "(no message)");
  return VK_FALSE;
}

VkDebugUtilsMessengerCreateInfoEXT messenger_info() {
  VkDebugUtilsMessengerCreateInfoEXT info{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
  info.messageSeverity =
      VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  info.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT;
  info.pfnUserCallback = on_debug_message;
  return info;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

int type_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return 2;
    case VK_PHYSICAL_DEVICE_TYPE_OTHER:
      return 3;
    default:
      return 4;  // CPU
  }
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string device_list(const std::vector<physical_device>& all) {
  std::string s;
  for (const auto& d : all)
    s += (s.empty() ? "" : ", ") + std::to_string(d.index) + ": " + d.name + " (" + device_type_name(d.type) + ")";
  return s.empty() ? "none" : s;
}

}  // namespace

const char* device_type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return "CPU";
    default:
      return "other";
  }
}

bool is_real_gpu(VkPhysicalDeviceType t) {
  return t == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU || t == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ||
         t == VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU;
}

std::uint64_t validation_message_count() {
  return g_validation_messages.load();
}

// ---- instance -----------------------------------------------------------------------------

std::shared_ptr<instance> instance::get() {
  static std::mutex m;
  static std::weak_ptr<instance> current;
  std::lock_guard lock(m);
  if (auto p = current.lock()) return p;
  std::shared_ptr<instance> p(new instance());
  p->create();
  current = p;
  return p;
}

void instance::create() {
  std::uint32_t n_ext = 0;
  CLEAVE_CHECK_VK(vkEnumerateInstanceExtensionProperties(nullptr, &n_ext, nullptr));
  std::vector<VkExtensionProperties> exts(n_ext);
  CLEAVE_CHECK_VK(vkEnumerateInstanceExtensionProperties(nullptr, &n_ext, exts.data()));
  auto has_ext = [&](const char* name) {
    return std::any_of(exts.begin(), exts.end(),
                       [&](const auto& e) { return std::strcmp(e.extensionName, name) == 0; });
  };

  std::vector<const char*> enabled_ext, layers;
  VkInstanceCreateFlags flags = 0;
  // MoltenVK and other portability drivers are listed only when asked for.
  if (has_ext("VK_KHR_portability_enumeration")) {
    enabled_ext.push_back("VK_KHR_portability_enumeration");
    flags |= 0x00000001;  // VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR
  }
  if (env_flag("CLEAVE_VK_VALIDATION")) {
    std::uint32_t n_layers = 0;
    CLEAVE_CHECK_VK(vkEnumerateInstanceLayerProperties(&n_layers, nullptr));
    std::vector<VkLayerProperties> props(n_layers);
    CLEAVE_CHECK_VK(vkEnumerateInstanceLayerProperties(&n_layers, props.data()));
    const bool have_layer = std::any_of(props.begin(), props.end(), [](const auto& l) {
      return std::strcmp(l.layerName, "VK_LAYER_KHRONOS_validation") == 0;
    });
    if (have_layer && has_ext(VK_EXT_DEBUG_UTILS_EXTENSION_NAME)) {
      layers.push_back("VK_LAYER_KHRONOS_validation");
      enabled_ext.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
      validation_ = true;
    } else {
      std::fprintf(stderr,
                   "cleave vulkan: CLEAVE_VK_VALIDATION set but VK_LAYER_KHRONOS_validation is not installed\n");
    }
  }

  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "cleave";
  app.pEngineName = "cleave";
  app.apiVersion = VK_API_VERSION_1_1;
  VkInstanceCreateInfo info{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  info.flags = flags;
  info.pApplicationInfo = &app;
  info.enabledLayerCount = static_cast<std::uint32_t>(layers.size());
  info.ppEnabledLayerNames = layers.data();
  info.enabledExtensionCount = static_cast<std::uint32_t>(enabled_ext.size());
  info.ppEnabledExtensionNames = enabled_ext.data();
  const auto dbg = messenger_info();
  if (validation_) info.pNext = &dbg;
  CLEAVE_CHECK_VK(vkCreateInstance(&info, nullptr, &instance_));

  if (validation_) {
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
    if (create) CLEAVE_CHECK_VK(create(instance_, &dbg, nullptr, &messenger_));
  }

  std::uint32_t n_dev = 0;
  CLEAVE_CHECK_VK(vkEnumeratePhysicalDevices(instance_, &n_dev, nullptr));
  std::vector<VkPhysicalDevice> handles(n_dev);
  CLEAVE_CHECK_VK(vkEnumeratePhysicalDevices(instance_, &n_dev, handles.data()));
  for (std::uint32_t i = 0; i < n_dev; ++i) {
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(handles[i], &props);
    if (props.apiVersion < VK_API_VERSION_1_1) continue;
    std::uint32_t n_fam = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(handles[i], &n_fam, nullptr);
    std::vector<VkQueueFamilyProperties> fams(n_fam);
    vkGetPhysicalDeviceQueueFamilyProperties(handles[i], &n_fam, fams.data());
    for (std::uint32_t f = 0; f < n_fam; ++f) {
      if (fams[f].queueCount > 0 && (fams[f].queueFlags & VK_QUEUE_COMPUTE_BIT)) {
        devices_.push_back({handles[i], i, props.deviceName, props.deviceType, f});
        break;
      }
    }
  }
}

instance::~instance() {
  if (messenger_) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy) destroy(instance_, messenger_, nullptr);
  }
  if (instance_) vkDestroyInstance(instance_, nullptr);
}

const physical_device& select_device(const std::vector<physical_device>& all, const std::string& spec) {
  if (all.empty()) throw core::error("vulkan: no device with a compute queue (Vulkan 1.1 or later) was found");
  if (spec.empty()) {
    return *std::min_element(all.begin(), all.end(), [](const auto& a, const auto& b) {
      return type_rank(a.type) != type_rank(b.type) ? type_rank(a.type) < type_rank(b.type) : a.index < b.index;
    });
  }
  if (std::all_of(spec.begin(), spec.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    const unsigned long idx = spec.size() > 9 ? ~0ul : std::stoul(spec);
    for (const auto& d : all)
      if (d.index == idx) return d;
    throw core::error("vulkan: no device with index " + spec + " (devices: " + device_list(all) + ")");
  }
  const std::string needle = lower(spec);
  for (const auto& d : all)
    if (lower(d.name).find(needle) != std::string::npos) return d;
  throw core::error("vulkan: no device whose name contains '" + spec + "' (devices: " + device_list(all) + ")");
}

// ---- device -------------------------------------------------------------------------------

std::shared_ptr<device> device::get(const std::string& spec) {
  static std::mutex m;
  static std::map<std::uint32_t, std::weak_ptr<device>> by_index;
  auto inst = instance::get();
  const physical_device& phys = select_device(inst->devices(), spec);
  std::lock_guard lock(m);
  if (auto p = by_index[phys.index].lock()) return p;
  std::shared_ptr<device> p(new device(inst, phys));
  by_index[phys.index] = p;
  return p;
}

device::device(std::shared_ptr<instance> inst, const physical_device& phys) : instance_(std::move(inst)), phys_(phys) {
  VkPhysicalDeviceMaintenance3Properties m3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceProperties2 props2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props2.pNext = &m3;
  vkGetPhysicalDeviceProperties2(phys_.handle, &props2);
  props_ = props2.properties;
  max_allocation_ = m3.maxMemoryAllocationSize;
  // The shaders use 256 invocations per workgroup and up to 8 storage buffers per dispatch,
  // above the minima Vulkan guarantees (128 and 4): refuse devices that cannot run them.
  const auto& lim = props_.limits;
  if (lim.maxComputeWorkGroupInvocations < 256 || lim.maxComputeWorkGroupSize[0] < 256 ||
      lim.maxPerStageDescriptorStorageBuffers < 8 || lim.maxPushConstantsSize < push_constant_bytes)
    throw core::error("vulkan: " + phys_.name + " is too small for cleave's shaders (workgroup invocations " +
                      std::to_string(lim.maxComputeWorkGroupInvocations) + ", storage buffers per stage " +
                      std::to_string(lim.maxPerStageDescriptorStorageBuffers) + "; needed 256 and 8)");

  // Memory types. Tensors live in device-local memory; on devices without separate video
  // memory (integrated GPUs, CPU devices) a host-visible coherent device-local type is used
  // so that uploads and downloads need no staging copy.
  VkPhysicalDeviceMemoryProperties mem;
  vkGetPhysicalDeviceMemoryProperties(phys_.handle, &mem);
  const VkMemoryPropertyFlags host_coherent =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  auto find_type = [&](VkMemoryPropertyFlags want) -> int {
    int best = -1;
    for (std::uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
      if ((mem.memoryTypes[i].propertyFlags & want) != want) continue;
      // Among matching types prefer the one on the largest heap.
      if (best < 0 ||
          mem.memoryHeaps[mem.memoryTypes[i].heapIndex].size > mem.memoryHeaps[mem.memoryTypes[best].heapIndex].size)
        best = static_cast<int>(i);
    }
    return best;
  };
  const bool unified = phys_.type != VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
  int tensor_type = unified ? find_type(VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | host_coherent) : -1;
  tensor_mappable_ = tensor_type >= 0;
  if (tensor_type < 0) tensor_type = find_type(VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  if (tensor_type < 0) tensor_type = find_type(0);
  int staging = find_type(host_coherent | VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  if (staging < 0) staging = find_type(host_coherent);
  if (tensor_type < 0 || staging < 0) throw core::error("vulkan: " + phys_.name + " has no usable memory type");
  tensor_type_ = static_cast<std::uint32_t>(tensor_type);
  staging_type_ = static_cast<std::uint32_t>(staging);
  if ((mem.memoryTypes[tensor_type_].propertyFlags & host_coherent) == host_coherent) tensor_mappable_ = true;

  std::uint32_t n_ext = 0;
  CLEAVE_CHECK_VK(vkEnumerateDeviceExtensionProperties(phys_.handle, nullptr, &n_ext, nullptr));
  std::vector<VkExtensionProperties> exts(n_ext);
  CLEAVE_CHECK_VK(vkEnumerateDeviceExtensionProperties(phys_.handle, nullptr, &n_ext, exts.data()));
  std::vector<const char*> enabled;
  for (const auto& e : exts)
    if (std::strcmp(e.extensionName, "VK_KHR_portability_subset") == 0) enabled.push_back("VK_KHR_portability_subset");

  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  queue.queueFamilyIndex = phys_.compute_family;
  queue.queueCount = 1;
  queue.pQueuePriorities = &priority;
  VkDeviceCreateInfo info{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  info.queueCreateInfoCount = 1;
  info.pQueueCreateInfos = &queue;
  info.enabledExtensionCount = static_cast<std::uint32_t>(enabled.size());
  info.ppEnabledExtensionNames = enabled.data();
  CLEAVE_CHECK_VK(vkCreateDevice(phys_.handle, &info, nullptr, &device_));
  vkGetDeviceQueue(device_, phys_.compute_family, 0, &queue_);

  VkPipelineCacheCreateInfo cache{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  CLEAVE_CHECK_VK(vkCreatePipelineCache(device_, &cache, nullptr, &cache_));
}

device::~device() {
  vkDeviceWaitIdle(device_);
  for (auto& [key, p] : pipelines_) vkDestroyPipeline(device_, p->handle, nullptr);
  for (auto& [name, m] : modules_) vkDestroyShaderModule(device_, m, nullptr);
  for (auto& [n, l] : layouts_) {
    vkDestroyPipelineLayout(device_, l.second, nullptr);
    vkDestroyDescriptorSetLayout(device_, l.first, nullptr);
  }
  vkDestroyPipelineCache(device_, cache_, nullptr);
  vkDestroyDevice(device_, nullptr);
}

void device::submit(const VkSubmitInfo& info, VkFence fence) {
  std::lock_guard lock(queue_mutex_);
  CLEAVE_CHECK_VK(vkQueueSubmit(queue_, 1, &info, fence));
}

VkDescriptorSetLayout device::set_layout(std::uint32_t n_bindings) {
  auto it = layouts_.find(n_bindings);
  if (it != layouts_.end()) return it->second.first;
  std::vector<VkDescriptorSetLayoutBinding> b(n_bindings);
  for (std::uint32_t i = 0; i < n_bindings; ++i)
    b[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  VkDescriptorSetLayoutCreateInfo info{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  info.bindingCount = n_bindings;
  info.pBindings = b.data();
  VkDescriptorSetLayout set = VK_NULL_HANDLE;
  CLEAVE_CHECK_VK(vkCreateDescriptorSetLayout(device_, &info, nullptr, &set));
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_constant_bytes};
  VkPipelineLayoutCreateInfo pl{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pl.setLayoutCount = 1;
  pl.pSetLayouts = &set;
  pl.pushConstantRangeCount = 1;
  pl.pPushConstantRanges = &range;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  if (const VkResult r = vkCreatePipelineLayout(device_, &pl, nullptr, &layout); r != VK_SUCCESS) {
    vkDestroyDescriptorSetLayout(device_, set, nullptr);
    throw_vk_error("vkCreatePipelineLayout", r, __FILE__, __LINE__);
  }
  layouts_[n_bindings] = {set, layout};
  return set;
}

const pipeline& device::get_pipeline(std::string_view shader, std::uint32_t n_bindings,
                                     std::span<const std::uint32_t> spec) {
  std::string key(shader);
  for (auto v : spec) {
    key += ',';
    key += std::to_string(v);
  }
  std::lock_guard lock(pipelines_mutex_);
  if (auto it = pipelines_.find(key); it != pipelines_.end()) return *it->second;

  auto mod_it = modules_.find(std::string(shader));
  if (mod_it == modules_.end()) {
    const spirv_code code = find_spirv(shader);
    CLEAVE_ASSERT(code.words != nullptr, "no embedded shader named " + std::string(shader));
    VkShaderModuleCreateInfo info{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    info.codeSize = code.bytes;
    info.pCode = code.words;
    VkShaderModule m = VK_NULL_HANDLE;
    CLEAVE_CHECK_VK(vkCreateShaderModule(device_, &info, nullptr, &m));
    mod_it = modules_.emplace(std::string(shader), m).first;
  }

  auto p = std::make_unique<pipeline>();
  p->n_bindings = n_bindings;
  p->set_layout = set_layout(n_bindings);
  p->layout = layouts_[n_bindings].second;

  std::vector<VkSpecializationMapEntry> entries(spec.size());
  for (std::uint32_t i = 0; i < spec.size(); ++i) entries[i] = {i, i * 4u, 4};
  VkSpecializationInfo spec_info{static_cast<std::uint32_t>(entries.size()), entries.data(), spec.size() * 4u,
                                 spec.data()};
  VkComputePipelineCreateInfo info{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  info.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  info.stage.module = mod_it->second;
  info.stage.pName = "main";
  info.stage.pSpecializationInfo = spec.empty() ? nullptr : &spec_info;
  info.layout = p->layout;
  CLEAVE_CHECK_VK(vkCreateComputePipelines(device_, cache_, 1, &info, nullptr, &p->handle));
  return *pipelines_.emplace(key, std::move(p)).first->second;
}

std::size_t device::n_pipelines() const {
  std::lock_guard lock(pipelines_mutex_);
  return pipelines_.size();
}

}  // namespace cleave::backend::vk
