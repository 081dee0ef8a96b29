// The process-wide cache of freed host blocks behind host_buffer.
#include "host_buffer.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

namespace cleave::backend::detail {

namespace {

constexpr std::size_t k_min_cached = 256 * 1024;

// Blocks below k_min_cached: 64-byte multiples. Larger: 8 classes per power of two, so a
// block is at most 1/8 larger than asked for.
std::size_t class_of(std::size_t bytes) {
  const std::size_t n = ((bytes + 63) / 64) * 64;
  if (n < k_min_cached) return n;
  std::size_t p = 1;
  while (p <= n / 2) p *= 2;
  const std::size_t step = p / 8;
  return (n + step - 1) / step * step;
}

std::size_t limit_from_env() {
  const char* v = std::getenv("CLEAVE_HOST_CACHE_MB");
  if (!v || !*v) return std::size_t{2048} << 20;
  char* end = nullptr;
  const unsigned long long mb = std::strtoull(v, &end, 10);
  if (*end != '\0') return std::size_t{2048} << 20;  // not a number: the default
  return static_cast<std::size_t>(mb) << 20;
}

struct cache {
  std::mutex mu;
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks;
  std::size_t cached = 0;
  // Bytes of cacheable blocks in use, and their most at once: the cache never holds more than
  // that most less what is in use, so the process holds no more than its peak of live memory
  // however the sizes change between phases (training, then evaluation at another batch).
  std::size_t live = 0, peak = 0;
  const std::size_t limit = limit_from_env();

  // Frees cached blocks, largest classes first, until live + cached <= peak (lock held).
  void trim() {
    while (cached > 0 && live + cached > peak) {
      auto big = free_blocks.end();
      for (auto it = free_blocks.begin(); it != free_blocks.end(); ++it)
        if (!it->second.empty() && (big == free_blocks.end() || it->first > big->first)) big = it;
      std::free(big->second.back());
      big->second.pop_back();
      cached -= big->first;
    }
  }

  void release() {
    std::lock_guard<std::mutex> lk(mu);
    for (auto& [size, blocks] : free_blocks)
      for (void* p : blocks) std::free(p);
    free_blocks.clear();
    cached = 0;
    peak = live;  // a fresh start: the peak is counted again from what is in use now
  }
};

// Never destroyed: buffers of static tensors may be freed after every static destructor ran.
cache& the_cache() {
  static cache* c = new cache;
  return *c;
}

}  // namespace

void* host_alloc(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  const std::size_t n = class_of(bytes);
  if (n >= k_min_cached) {
    cache& c = the_cache();
    std::lock_guard<std::mutex> lk(c.mu);
    auto it = c.free_blocks.find(n);
    c.live += n;
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= n;
      return p;
    }
    // A size the cache does not hold: new memory, in place of cached blocks of other sizes
    // where these would take the process above its peak.
    c.peak = std::max(c.peak, c.live);
    c.trim();
  }
  void* p = std::aligned_alloc(64, n);
  if (!p) {
    // Cached blocks of other sizes may be what stands in the way.
    host_cache_release();
    p = std::aligned_alloc(64, n);
    if (!p) throw std::bad_alloc();
  }
  return p;
}

void host_free(void* p, std::size_t bytes) {
  if (!p) return;
  const std::size_t n = class_of(bytes);
  if (n >= k_min_cached) {
    cache& c = the_cache();
    std::lock_guard<std::mutex> lk(c.mu);
    c.live -= n;
    if (c.cached + n <= c.limit) {
      c.free_blocks[n].push_back(p);
      c.cached += n;
      return;
    }
  }
  std::free(p);
}

void host_cache_release() {
  the_cache().release();
}

host_cache_stats host_cache_now() {
  cache& c = the_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  return {c.cached, c.live, c.peak};
}

}  // namespace cleave::backend::detail
