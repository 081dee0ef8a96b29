// A process-wide cache of large, 32-byte aligned blocks: frame buffers and message builders reuse
// them instead of faulting in fresh pages for every multi-megabyte tensor message.
#pragma once

#include <cstddef>

namespace cleave::transport::detail {

// Blocks below this size go straight to the C allocator, which already recycles them well.
inline constexpr std::size_t pooled_min_bytes = 64u << 10;

// Returns a block of at least `bytes` (its size in `capacity`), or nullptr when out of memory.
void* pool_take(std::size_t bytes, std::size_t& capacity);
// The capacity pool_take gives for a request of `bytes`.
std::size_t pool_capacity(std::size_t bytes);
// Gives back a block obtained from pool_take with its capacity.
void pool_give(void* p, std::size_t capacity);

}  // namespace cleave::transport::detail
