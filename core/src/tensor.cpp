// Tensor views over backend buffers.
#include "cleave/core/tensor.h"

namespace cleave::core {

tensor::tensor(buffer_ptr buf, std::size_t byte_offset, core::shape s, core::dtype t)
    : buf_(std::move(buf)), offset_(byte_offset), shape_(s), dtype_(t) {
  CLEAVE_ASSERT(buf_ != nullptr);
  CLEAVE_ASSERT(offset_ + bytes() <= buf_->bytes(), "tensor view past the end of its buffer");
}

void* tensor::host_data() const {
  CLEAVE_ASSERT(buf_ != nullptr, "undefined tensor");
  auto* base = static_cast<char*>(buf_->host_data());
  CLEAVE_ASSERT(base != nullptr, "tensor memory is not host-visible");
  return base + offset_;
}

float* tensor::f32() const {
  CLEAVE_ASSERT(dtype_ == core::dtype::f32, "tensor is not f32");
  return host<float>();
}

tensor tensor::reshaped(core::shape s) const {
  CLEAVE_ASSERT(s.numel() == numel(), "reshape " + shape_.str() + " -> " + s.str());
  return tensor(buf_, offset_, s, dtype_);
}

tensor tensor::view(std::size_t byte_offset, core::shape s, core::dtype t) const {
  return tensor(buf_, offset_ + byte_offset, s, t);
}

tensor tensor::slice_batch(std::int64_t first, std::int64_t n) const {
  CLEAVE_ASSERT(shape_.rank() > 0 && first >= 0 && first + n <= shape_[0]);
  const auto item = static_cast<std::size_t>(shape_.numel_from(1)) * dtype_size(dtype_);
  return tensor(buf_, offset_ + static_cast<std::size_t>(first) * item, shape_.with_batch(n), dtype_);
}

}  // namespace cleave::core
