// Device memory of the CUDA backend: a caching allocator (size-bucketed free lists, so tensors
// do not cost a cudaMalloc each), the buffer type it hands out, and pinned host staging.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cleave/core/tensor.h"

namespace cleave::backend::detail {

// Makes `device` current for the calling thread while in scope (cheap when it already is).
class device_guard {
 public:
  explicit device_guard(int device) {
    if (cudaGetDevice(&prev_) == cudaSuccess && prev_ != device && cudaSetDevice(device) == cudaSuccess)
      switched_ = true;
  }
  ~device_guard() {
    if (switched_) cudaSetDevice(prev_);
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

// Blocks are cached per rounded size and reused by later requests of the same bucket. Every
// user of the blocks issues its work on one stream, so a block freed by the host while kernels
// that use it are still queued is safe to hand out again: its next use is queued after them.
class device_allocator {
 public:
  explicit device_allocator(int device) : device_(device) {}
  ~device_allocator();
  device_allocator(const device_allocator&) = delete;
  device_allocator& operator=(const device_allocator&) = delete;

  // The bucket a request of `bytes` falls in: at most 25% over, multiples of 512 bytes.
  static std::size_t bucket_size(std::size_t bytes);

  // A block of bucket_size(bytes) bytes. Throws core::error when the device is out of memory
  // even after the cache is emptied.
  void* acquire(std::size_t bytes);
  // Returns a block from acquire(bytes) to the cache.
  void release(void* p, std::size_t bytes) noexcept;
  // Frees every cached block (cudaFree synchronises the device).
  void trim() noexcept;

  struct stats {
    std::size_t n_device_allocs = 0;  // cudaMalloc calls so far
    std::size_t bytes_in_use = 0;     // handed out, bucket sizes
    std::size_t bytes_cached = 0;     // free in the cache
  };
  stats get_stats() const;

 private:
  void trim_locked() noexcept;

  int device_;
  mutable std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;  // bucket size -> blocks
  stats stats_;
};

// A tensor buffer in device memory; returns its block to the allocator when the last view dies.
class device_buffer final : public core::buffer {
 public:
  device_buffer(core::backend* owner, std::size_t bytes, std::shared_ptr<device_allocator> alloc)
      : core::buffer(owner, bytes), alloc_(std::move(alloc)), data_(alloc_->acquire(bytes)) {}
  ~device_buffer() override { alloc_->release(data_, bytes()); }
  void* device_data() const { return data_; }

 private:
  std::shared_ptr<device_allocator> alloc_;
  void* data_;
};

// Pinned host memory for uploads and downloads, in two slots so that copying one chunk on the
// host overlaps the DMA of the previous one. Each slot has an event marking when its last
// copy has finished.
class pinned_staging {
 public:
  pinned_staging() = default;
  ~pinned_staging();
  pinned_staging(const pinned_staging&) = delete;
  pinned_staging& operator=(const pinned_staging&) = delete;

  // host -> device, ordered on `stream`; returns once `src` may be reused.
  void upload(void* dst_device, const void* src, std::size_t bytes, cudaStream_t stream);
  // device -> host after the work already queued on `stream`; returns when `dst` is filled.
  void download(void* dst, const void* src_device, std::size_t bytes, cudaStream_t stream);

  static constexpr std::size_t k_max_chunk = std::size_t{16} << 20;

 private:
  struct slot {
    void* host = nullptr;
    std::size_t capacity = 0;
    cudaEvent_t done = nullptr;
  };
  slot& ready(int i, std::size_t bytes);  // waits for the slot's last copy, grows it if needed

  slot slots_[2];
};

}  // namespace cleave::backend::detail
