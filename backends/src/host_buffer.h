// Host memory buffers shared by the CPU backends (reference, onednn), drawn from a process-wide
// cache of freed blocks.
//
// A training step allocates every activation and gradient afresh; memory the C library hands
// back to the kernel between steps is faulted in again page by page on first touch, which on
// virtual machines costs more than the convolutions (about 3 ms per MB measured on a 2-core VM).
// Freed blocks of 256 KiB and more are kept, by size class, and handed out again, so a
// steady-state step touches no new pages. The cache holds at most CLEAVE_HOST_CACHE_MB MiB
// (default 2048; 0 turns it off). Its blocks are pages mapped for them, so that releasing the
// cache (core::backend::release_cached_memory, between training and evaluation) gives the
// memory back to the system. Sizes are rounded up by at most 1/8 of a block.
#pragma once

#include <cstddef>
#include <memory>

#include "cleave/core/tensor.h"

namespace cleave::backend::detail {

// 64-byte aligned memory of at least `bytes` (cached blocks may be larger); host_free gives it back.
void* host_alloc(std::size_t bytes);
void host_free(void* p, std::size_t bytes);
// Frees every cached block (memory the process holds but no tensor uses).
void host_cache_release();
// Bytes the cache holds.
std::size_t host_cache_bytes();

// What a backend notes on a buffer: the oneDNN backend, which parts of it hold a tensor in one of
// its blocked layouts instead of the row-major order of the tensor's shape.
struct buffer_note {
  virtual ~buffer_note() = default;
};

class host_buffer final : public core::buffer {
 public:
  host_buffer(core::backend* owner, std::size_t bytes) : core::buffer(owner, bytes), data_(host_alloc(bytes)) {}
  ~host_buffer() override { host_free(data_, bytes()); }
  void* host_data() override { return data_ ? data_ : static_cast<void*>(&empty_); }
  // The owning backend's note; null until it makes one. It dies with the buffer.
  std::unique_ptr<buffer_note> note;

 private:
  void* data_ = nullptr;
  alignas(64) char empty_ = 0;
};

}  // namespace cleave::backend::detail
