// Tensors: a dtype, a shape and a view (byte offset) into a buffer owned by a backend.
// Many tensors may view one buffer: a stage keeps all its parameters in one buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "cleave/core/dtype.h"
#include "cleave/core/error.h"
#include "cleave/core/shape.h"

namespace cleave::core {

class backend;

// A block of memory on one backend. Host backends expose a host pointer; device backends
// keep their handle in a subclass and return nullptr from host_data().
class buffer {
 public:
  buffer(backend* owner, std::size_t bytes) : owner_(owner), bytes_(bytes) {}
  virtual ~buffer() = default;
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;

  backend* owner() const { return owner_; }
  std::size_t bytes() const { return bytes_; }
  // Host-addressable memory, or nullptr when the memory lives on a device.
  virtual void* host_data() { return nullptr; }

 private:
  backend* owner_;
  std::size_t bytes_;
};

// Shared ownership: views (parameter slices, reshapes) keep their buffer alive.
using buffer_ptr = std::shared_ptr<buffer>;

class tensor {
 public:
  tensor() = default;
  tensor(buffer_ptr buf, std::size_t byte_offset, core::shape s, core::dtype t);

  bool defined() const { return buf_ != nullptr; }
  const core::shape& shape() const { return shape_; }
  core::dtype dtype() const { return dtype_; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  buffer* buf() const { return buf_.get(); }
  const buffer_ptr& buf_ptr() const { return buf_; }
  std::size_t offset() const { return offset_; }
  backend* owner() const { return buf_ ? buf_->owner() : nullptr; }

  // Host pointer to the first element; asserts the buffer is host-visible.
  void* host_data() const;
  template <class T>
  T* host() const {
    return static_cast<T*>(host_data());
  }
  float* f32() const;  // asserts dtype f32

  // The same memory with another shape of equal element count.
  tensor reshaped(core::shape s) const;
  // A view of `s` elements of type `t` starting `byte_offset` bytes into this tensor.
  tensor view(std::size_t byte_offset, core::shape s, core::dtype t) const;
  // Items [first, first + n) along dimension 0.
  tensor slice_batch(std::int64_t first, std::int64_t n) const;

 private:
  buffer_ptr buf_;
  std::size_t offset_ = 0;
  core::shape shape_;
  core::dtype dtype_ = core::dtype::f32;
};

}  // namespace cleave::core
