// Device memory sub-allocation: tensors are ranges inside a few large VkBuffers (blocks) of one
// memory type, so allocating a tensor costs no driver call once the pool is warm. A released
// range is reused only after the GPU work recorded before its release has finished.
#pragma once

#include <vulkan/vulkan.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cleave/core/tensor.h"
#include "vk_device.h"

namespace cleave::backend::vk {

class memory_pool {
 public:
  struct block {
    VkDeviceMemory memory = VK_NULL_HANDLE;
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceSize size = 0;
    std::byte* mapped = nullptr;                 // host address when the memory is mappable
    std::map<VkDeviceSize, VkDeviceSize> free_;  // offset -> size, coalesced
    VkDeviceSize used = 0;
    bool dedicated = false;  // made for one large allocation; freed when empty
  };
  struct allocation {
    block* blk = nullptr;
    VkDeviceSize offset = 0;
    VkDeviceSize size = 0;
  };
  struct stats {
    std::size_t n_blocks = 0;
    std::size_t n_device_allocations = 0;  // vkAllocateMemory calls so far
    std::size_t n_live = 0;                // ranges handed out and not yet released
    VkDeviceSize reserved_bytes = 0;       // sum of block sizes
    VkDeviceSize used_bytes = 0;           // sum of live and pending-release range sizes
  };

  // `mapped`: map every block persistently (the memory type must be host-visible).
  memory_pool(std::shared_ptr<device> dev, std::uint32_t memory_type, bool mapped, VkDeviceSize block_size);
  ~memory_pool();
  memory_pool(const memory_pool&) = delete;
  memory_pool& operator=(const memory_pool&) = delete;

  // A range of at least `bytes` bytes, aligned for storage-buffer binding (at least 64 bytes).
  // Throws core::error when the device is out of memory or the size exceeds what one
  // storage-buffer binding can address.
  allocation allocate(VkDeviceSize bytes);
  // The range becomes reusable once the batch recording now (see set_recording_serial) is done.
  void release(const allocation& a);

  // Serial numbers of command batches, set by the stream that records work on this pool's
  // memory: ranges released while batch `s` records are reused after batch `s` completes.
  void set_recording_serial(std::uint64_t s);
  void set_completed_serial(std::uint64_t s);

  stats get_stats() const;
  VkDeviceSize alignment() const { return align_; }
  bool mapped() const { return mapped_; }

 private:
  block* new_block(VkDeviceSize size, bool dedicated);
  void destroy_block(block* b);
  void free_range(const allocation& a);
  void collect();

  std::shared_ptr<device> dev_;
  std::uint32_t memory_type_;
  bool mapped_;
  VkDeviceSize block_size_;
  VkDeviceSize align_;
  VkDeviceSize max_range_;

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<block>> blocks_;
  std::vector<std::pair<std::uint64_t, allocation>> pending_;
  std::uint64_t recording_ = 1, completed_ = 0;
  std::size_t n_device_allocations_ = 0, n_live_ = 0;
};

// A tensor buffer: one range of a memory_pool. The pool stays alive as long as any buffer.
class vk_buffer final : public core::buffer {
 public:
  vk_buffer(core::backend* owner, std::size_t bytes, std::shared_ptr<memory_pool> pool, memory_pool::allocation a)
      : core::buffer(owner, bytes), pool_(std::move(pool)), alloc_(a) {}
  ~vk_buffer() override {
    if (alloc_.blk) pool_->release(alloc_);
  }
  const memory_pool::allocation& alloc() const { return alloc_; }
  const std::shared_ptr<memory_pool>& pool() const { return pool_; }

 private:
  std::shared_ptr<memory_pool> pool_;
  memory_pool::allocation alloc_;
};

}  // namespace cleave::backend::vk
