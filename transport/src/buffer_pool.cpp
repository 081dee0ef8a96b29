// Size-classed free lists (four classes per power of two) with a bound on what they keep.
#include "buffer_pool.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "cleave/transport/frame.h"

namespace cleave::transport::detail {

namespace {

constexpr std::size_t max_cached_bytes = 512u << 20;
constexpr std::size_t max_blocks_per_class = 32;

// The smallest class size >= n: 1, 1.25, 1.5 or 1.75 times a power of two (page multiples).
std::size_t class_size(std::size_t n) {
  if (n < pooled_min_bytes) return (n + frame_alignment - 1) / frame_alignment * frame_alignment;
  std::size_t p = pooled_min_bytes;
  while (p * 2 <= n && p * 2 > p) p *= 2;
  for (std::size_t q = p; q <= 2 * p; q += p / 4)
    if (q >= n) return q;
  return n;  // unreachable
}

struct pool {
  std::mutex mu;
  std::map<std::size_t, std::vector<void*>> free;
  std::size_t cached = 0;
};

pool& the_pool() {
  static pool* p = new pool;  // never destroyed: blocks may be returned during static destruction
  return *p;
}

}  // namespace

std::size_t pool_capacity(std::size_t bytes) {
  return class_size(bytes == 0 ? 1 : bytes);
}

void* pool_take(std::size_t bytes, std::size_t& capacity) {
  capacity = pool_capacity(bytes);
  if (capacity < bytes) return nullptr;
  if (capacity >= pooled_min_bytes) {
    pool& p = the_pool();
    std::lock_guard lock(p.mu);
    auto it = p.free.find(capacity);
    if (it != p.free.end() && !it->second.empty()) {
      void* block = it->second.back();
      it->second.pop_back();
      p.cached -= capacity;
      return block;
    }
  }
  return std::aligned_alloc(frame_alignment, capacity);
}

void pool_give(void* block, std::size_t capacity) {
  if (!block) return;
  if (capacity >= pooled_min_bytes) {
    pool& p = the_pool();
    std::lock_guard lock(p.mu);
    auto& list = p.free[capacity];
    if (list.size() < max_blocks_per_class && p.cached + capacity <= max_cached_bytes) {
      list.push_back(block);
      p.cached += capacity;
      return;
    }
  }
  std::free(block);
}

}  // namespace cleave::transport::detail
