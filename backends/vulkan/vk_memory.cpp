// The device memory pool: blocks of one VkDeviceMemory and one VkBuffer each, split into
// ranges by a first-fit free list with coalescing.
#include "vk_memory.h"

#include <algorithm>

#include "cleave/core/error.h"
#include "vk_check.h"

namespace cleave::backend::vk {

namespace {

VkDeviceSize round_up(VkDeviceSize v, VkDeviceSize a) {
  return (v + a - 1) / a * a;
}

std::string mib(VkDeviceSize b) {
  return std::to_string(static_cast<double>(b) / (1024.0 * 1024.0)) + " MiB";
}

}  // namespace

memory_pool::memory_pool(std::shared_ptr<device> dev, std::uint32_t memory_type, bool mapped, VkDeviceSize block_size)
    : dev_(std::move(dev)), memory_type_(memory_type), mapped_(mapped), block_size_(block_size) {
  const auto& lim = dev_->limits();
  align_ = std::max<VkDeviceSize>({64, lim.minStorageBufferOffsetAlignment, lim.nonCoherentAtomSize});
  // A tensor is bound as one storage-buffer range: it cannot exceed maxStorageBufferRange.
  max_range_ = std::min<VkDeviceSize>(lim.maxStorageBufferRange, dev_->max_allocation());
  block_size_ = std::min(block_size_, round_up(max_range_ / 2, align_));
}

memory_pool::~memory_pool() {
  for (auto& b : blocks_) destroy_block(b.get());
}

memory_pool::block* memory_pool::new_block(VkDeviceSize size, bool dedicated) {
  VkDevice d = dev_->handle();
  auto b = std::make_unique<block>();
  b->size = size;
  b->dedicated = dedicated;
  VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  info.size = size;
  info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  CLEAVE_CHECK_VK(vkCreateBuffer(d, &info, nullptr, &b->buffer));
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(d, b->buffer, &req);
  if (!(req.memoryTypeBits & (1u << memory_type_))) {
    vkDestroyBuffer(d, b->buffer, nullptr);
    throw core::error("vulkan: storage buffers cannot use the chosen memory type on " + dev_->physical().name);
  }
  VkMemoryAllocateInfo alloc{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  alloc.allocationSize = req.size;
  alloc.memoryTypeIndex = memory_type_;
  if (const VkResult r = vkAllocateMemory(d, &alloc, nullptr, &b->memory); r != VK_SUCCESS) {
    vkDestroyBuffer(d, b->buffer, nullptr);
    if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
      throw core::error("vulkan: out of memory on " + dev_->physical().name + " allocating a block of " + mib(size) +
                        " (" + result_name(r) + ")");
    throw_vk_error("vkAllocateMemory", r, __FILE__, __LINE__);
  }
  ++n_device_allocations_;
  CLEAVE_CHECK_VK(vkBindBufferMemory(d, b->buffer, b->memory, 0));
  if (mapped_) {
    void* p = nullptr;
    CLEAVE_CHECK_VK(vkMapMemory(d, b->memory, 0, VK_WHOLE_SIZE, 0, &p));
    b->mapped = static_cast<std::byte*>(p);
  }
  b->free_[0] = size;
  blocks_.push_back(std::move(b));
  return blocks_.back().get();
}

void memory_pool::destroy_block(block* b) {
  VkDevice d = dev_->handle();
  if (b->mapped) vkUnmapMemory(d, b->memory);
  vkDestroyBuffer(d, b->buffer, nullptr);
  vkFreeMemory(d, b->memory, nullptr);
}

memory_pool::allocation memory_pool::allocate(VkDeviceSize bytes) {
  const VkDeviceSize size = round_up(std::max<VkDeviceSize>(bytes, 1), align_);
  if (size > max_range_)
    throw core::error("vulkan: a buffer of " + mib(bytes) + " exceeds the largest one " + dev_->physical().name +
                      " can bind (" + mib(max_range_) + ")");
  std::lock_guard lock(mutex_);
  collect();
  auto take = [&](block* b) -> allocation {
    for (auto it = b->free_.begin(); it != b->free_.end(); ++it) {
      if (it->second < size) continue;
      const VkDeviceSize off = it->first, left = it->second - size;
      b->free_.erase(it);
      if (left) b->free_[off + size] = left;
      b->used += size;
      ++n_live_;
      return {b, off, size};
    }
    return {};
  };
  for (auto& b : blocks_)
    if (b->size - b->used >= size)
      if (auto a = take(b.get()); a.blk) return a;
  const bool dedicated = size > block_size_ / 2;
  block* b = new_block(dedicated ? size : block_size_, dedicated);
  return take(b);
}

void memory_pool::free_range(const allocation& a) {
  block* b = a.blk;
  auto next = b->free_.lower_bound(a.offset);
  VkDeviceSize off = a.offset, size = a.size;
  if (next != b->free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      size += prev->second;
      b->free_.erase(prev);
    }
  }
  if (next != b->free_.end() && off + size == next->first) {
    size += next->second;
    b->free_.erase(next);
  }
  b->free_[off] = size;
  b->used -= a.size;
  --n_live_;
}

void memory_pool::release(const allocation& a) {
  std::lock_guard lock(mutex_);
  if (recording_ <= completed_) {
    free_range(a);
    collect();
  } else {
    pending_.emplace_back(recording_, a);
  }
}

void memory_pool::collect() {
  // Caller holds mutex_.
  auto done = std::partition(pending_.begin(), pending_.end(), [&](const auto& p) { return p.first > completed_; });
  for (auto it = done; it != pending_.end(); ++it) free_range(it->second);
  pending_.erase(done, pending_.end());
  // Return empty dedicated blocks to the driver, and keep at most one empty regular block.
  bool kept_empty = false;
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    block* b = it->get();
    if (b->used == 0 && (b->dedicated || kept_empty)) {
      destroy_block(b);
      it = blocks_.erase(it);
      continue;
    }
    if (b->used == 0) kept_empty = true;
    ++it;
  }
}

void memory_pool::set_recording_serial(std::uint64_t s) {
  std::lock_guard lock(mutex_);
  recording_ = s;
}

void memory_pool::set_completed_serial(std::uint64_t s) {
  std::lock_guard lock(mutex_);
  completed_ = std::max(completed_, s);
  collect();
}

memory_pool::stats memory_pool::get_stats() const {
  std::lock_guard lock(mutex_);
  stats s;
  s.n_blocks = blocks_.size();
  s.n_device_allocations = n_device_allocations_;
  s.n_live = n_live_;
  for (const auto& b : blocks_) {
    s.reserved_bytes += b->size;
    s.used_bytes += b->used;
  }
  return s;
}

}  // namespace cleave::backend::vk
