// Device pointers of the CUDA backend's tensors, with the ownership and dtype checks every op
// makes before touching them.
#pragma once

#include <string>

#include "cleave/core/backend.h"
#include "cuda_memory.h"

namespace cleave::backend::detail {

// Device address of t's first element (t belongs to a CUDA backend).
inline void* raw(const core::tensor& t) {
  return static_cast<char*>(static_cast<device_buffer*>(t.buf())->device_data()) + t.offset();
}

// Asserts t is defined and belongs to backend b (any dtype).
inline void expect_mine(const core::backend& b, const core::tensor& t, const char* what) {
  CLEAVE_ASSERT(t.defined(), std::string(what) + " is undefined");
  CLEAVE_ASSERT(t.owner() == &b, std::string(what) + " belongs to another backend");
}

// Device f32 pointer of t after checking it is defined, on b and f32.
inline float* f32(const core::backend& b, const core::tensor& t, const char* what) {
  core::expect_f32(b, t, what);
  return static_cast<float*>(raw(t));
}

}  // namespace cleave::backend::detail
