// Caching device allocator and pinned host staging of the CUDA backend.
#include "cuda_memory.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#include "cleave/core/error.h"
#include "cuda_check.h"

namespace cleave::backend::detail {

std::size_t device_allocator::bucket_size(std::size_t bytes) {
  const std::size_t b = std::max<std::size_t>(bytes, 512);
  // Four buckets per power of two: the step is a quarter of the largest power of two <= b.
  const std::size_t step = std::max<std::size_t>(std::bit_floor(b) / 4, 512);
  return (b + step - 1) / step * step;
}

device_allocator::~device_allocator() {
  std::lock_guard lock(mutex_);
  trim_locked();
}

void* device_allocator::acquire(std::size_t bytes) {
  const std::size_t size = bucket_size(bytes);
  std::lock_guard lock(mutex_);
  if (auto it = free_.find(size); it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    stats_.bytes_cached -= size;
    stats_.bytes_in_use += size;
    return p;
  }
  device_guard scope(device_);
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, size);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the (non-sticky) error, give the cache back and retry once
    trim_locked();
    e = cudaMalloc(&p, size);
  }
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw core::error("cuda: out of device memory allocating " + std::to_string(size) + " bytes (" +
                      std::to_string(stats_.bytes_in_use) + " bytes in use)");
  }
  CLEAVE_CHECK_CUDA(e);
  ++stats_.n_device_allocs;
  stats_.bytes_in_use += size;
  return p;
}

void device_allocator::release(void* p, std::size_t bytes) noexcept {
  const std::size_t size = bucket_size(bytes);
  std::lock_guard lock(mutex_);
  try {
    free_[size].push_back(p);
    stats_.bytes_cached += size;
  } catch (...) {
    device_guard scope(device_);
    cudaFree(p);  // no memory for the list entry: free the block instead
  }
  stats_.bytes_in_use -= size;
}

void device_allocator::trim() noexcept {
  std::lock_guard lock(mutex_);
  trim_locked();
}

void device_allocator::trim_locked() noexcept {
  device_guard scope(device_);
  for (auto& [size, blocks] : free_)
    for (void* p : blocks) cudaFree(p);
  free_.clear();
  stats_.bytes_cached = 0;
}

device_allocator::stats device_allocator::get_stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

pinned_staging::~pinned_staging() {
  for (auto& s : slots_) {
    if (s.done) {
      cudaEventSynchronize(s.done);
      cudaEventDestroy(s.done);
    }
    if (s.host) cudaFreeHost(s.host);
  }
}

pinned_staging::slot& pinned_staging::ready(int i, std::size_t bytes) {
  slot& s = slots_[i];
  if (!s.done) CLEAVE_CHECK_CUDA(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  CLEAVE_CHECK_CUDA(cudaEventSynchronize(s.done));
  if (s.capacity < bytes) {
    if (s.host) CLEAVE_CHECK_CUDA(cudaFreeHost(s.host));
    s.host = nullptr;
    s.capacity = 0;
    const std::size_t cap = std::min(k_max_chunk, std::max<std::size_t>(std::bit_ceil(bytes), 1 << 16));
    CLEAVE_CHECK_CUDA(cudaHostAlloc(&s.host, cap, cudaHostAllocDefault));
    s.capacity = cap;
  }
  return s;
}

void pinned_staging::upload(void* dst_device, const void* src, std::size_t bytes, cudaStream_t stream) {
  auto* dst = static_cast<char*>(dst_device);
  const auto* from = static_cast<const char*>(src);
  for (std::size_t done = 0, k = 0; done < bytes; ++k) {
    const std::size_t n = std::min(k_max_chunk, bytes - done);
    slot& s = ready(static_cast<int>(k & 1), n);
    std::memcpy(s.host, from + done, n);
    CLEAVE_CHECK_CUDA(cudaMemcpyAsync(dst + done, s.host, n, cudaMemcpyHostToDevice, stream));
    CLEAVE_CHECK_CUDA(cudaEventRecord(s.done, stream));
    done += n;
  }
  // The caller's memory has been copied into staging: it may be reused at once. The slots'
  // events keep later uploads from overwriting staging before its DMA has finished.
}

void pinned_staging::download(void* dst, const void* src_device, std::size_t bytes, cudaStream_t stream) {
  auto* to = static_cast<char*>(dst);
  const auto* src = static_cast<const char*>(src_device);
  std::size_t pending_at = 0, pending_n = 0;
  int pending_slot = -1;
  for (std::size_t done = 0, k = 0; done < bytes; ++k) {
    const int i = static_cast<int>(k & 1);
    const std::size_t n = std::min(k_max_chunk, bytes - done);
    slot& s = ready(i, n);
    CLEAVE_CHECK_CUDA(cudaMemcpyAsync(s.host, src + done, n, cudaMemcpyDeviceToHost, stream));
    CLEAVE_CHECK_CUDA(cudaEventRecord(s.done, stream));
    if (pending_slot >= 0) {  // copy out the previous chunk while this one is in flight
      slot& p = slots_[pending_slot];
      CLEAVE_CHECK_CUDA(cudaEventSynchronize(p.done));
      std::memcpy(to + pending_at, p.host, pending_n);
    }
    pending_slot = i;
    pending_at = done;
    pending_n = n;
    done += n;
  }
  if (pending_slot >= 0) {
    slot& p = slots_[pending_slot];
    CLEAVE_CHECK_CUDA(cudaEventSynchronize(p.done));
    std::memcpy(to + pending_at, p.host, pending_n);
  }
}

}  // namespace cleave::backend::detail
