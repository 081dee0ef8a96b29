// Command recording: compute dispatches and copies go into the current command buffer, with a
// pipeline barrier inserted only where a command touches memory an earlier command of the same
// batch wrote (or writes memory it read). The batch is submitted when the host needs a result
// (download, synchronize) or when it grows past a limit, so a stage's whole forward or backward
// pass is usually one vkQueueSubmit.
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "vk_device.h"
#include "vk_memory.h"

namespace cleave::backend::vk {

// A byte range of a pool block that a command reads or writes.
struct access {
  const memory_pool::block* blk = nullptr;
  VkDeviceSize begin = 0, end = 0;  // [begin, end), rounded out to 4-byte words
  bool write = false;
};

// A storage-buffer binding: the range bound (offset aligned as the device requires) and the
// bytes the command really touches.
struct binding {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceSize offset = 0, range = 0;
  access touched;
};

class stream {
 public:
  struct stats {
    std::uint64_t n_submits = 0;
    std::uint64_t n_dispatches = 0;
    std::uint64_t n_barriers = 0;
    std::uint64_t n_copies = 0;
  };

  // `pools`: the memory pools whose ranges this stream's commands use; they learn which batches
  // have completed so released ranges are reused only when no command can still touch them.
  stream(std::shared_ptr<device> dev, std::vector<memory_pool*> pools);
  ~stream();
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;

  // Records one dispatch of `p` with one binding per descriptor and `push_bytes` of push constants.
  void dispatch(const pipeline& p, std::span<const binding> bindings, const void* push, std::uint32_t push_bytes,
                std::uint32_t gx, std::uint32_t gy = 1, std::uint32_t gz = 1);
  // Records a buffer-to-buffer copy of src.touched into dst (same size; regions must not overlap).
  void copy(const binding& src, const binding& dst);

  // Submits the batch being recorded (if any). With `wait`, also waits until every submitted
  // batch has finished.
  void flush(bool wait);
  // Waits for the submitted batches without submitting the one being recorded.
  void wait_in_flight();
  // Whether a command recorded but not yet submitted touches (write_only: writes) the range.
  bool batch_touches(const access& a, bool write_only) const;
  // Whether any submitted batch is still running.
  bool in_flight() const;

  // A batch is submitted once it holds this many dispatches and copies.
  void set_batch_limit(std::uint32_t n) { batch_limit_ = n; }
  const stats& get_stats() const { return stats_; }

 private:
  struct frame {
    VkCommandPool pool = VK_NULL_HANDLE;
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    std::vector<VkDescriptorPool> descriptor_pools;
    std::size_t active_pool = 0;
    std::uint64_t serial = 0;
    bool in_flight = false;
  };

  void begin_batch();
  void before_command(std::span<const access> accesses);
  void barrier();
  VkDescriptorSet allocate_set(VkDescriptorSetLayout layout);
  VkDescriptorPool new_descriptor_pool();
  void wait_frame(frame& f);
  void completed(std::uint64_t serial);

  std::shared_ptr<device> dev_;
  std::vector<memory_pool*> pools_;
  static constexpr std::size_t n_frames = 3;
  std::array<frame, n_frames> frames_;
  std::size_t current_ = 0;
  bool recording_ = false;
  std::uint32_t n_commands_ = 0, batch_limit_ = 1024;
  std::uint64_t last_serial_ = 0;
  // Accesses since the last barrier, and of the whole batch being recorded.
  std::vector<access> since_barrier_, batch_;
  stats stats_;
};

}  // namespace cleave::backend::vk
