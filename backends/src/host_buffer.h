// Host memory buffers shared by the CPU backends (reference, onednn).
#pragma once

#include <cstdlib>
#include <new>

#include "cleave/core/tensor.h"

namespace cleave::backend::detail {

class host_buffer final : public core::buffer {
 public:
  host_buffer(core::backend* owner, std::size_t bytes) : core::buffer(owner, bytes) {
    // 64-byte aligned, rounded up (aligned_alloc needs a multiple of the alignment).
    const std::size_t n = ((bytes + 63) / 64) * 64;
    data_ = n ? std::aligned_alloc(64, n) : nullptr;
    if (n && !data_) throw std::bad_alloc();
  }
  ~host_buffer() override { std::free(data_); }
  void* host_data() override { return data_ ? data_ : static_cast<void*>(&empty_); }

 private:
  void* data_ = nullptr;
  alignas(64) char empty_ = 0;
};

}  // namespace cleave::backend::detail
