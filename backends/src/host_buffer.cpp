// The process-wide cache of freed host blocks behind host_buffer.
#include "host_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

namespace cleave::backend::detail {

namespace {

constexpr std::size_t k_min_cached = 256 * 1024;

// Blocks of the cached sizes are mapped pages of their own, not the C library's: unmapping one
// gives its memory back to the system at once, where the C library may keep freed blocks in its
// heap (its threshold for mapping large blocks rises as they are freed).
void* map_block(std::size_t n) {
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}
void unmap_block(void* p, std::size_t n) {
  ::munmap(p, n);
}

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
  const std::size_t limit = limit_from_env();

  void release() {
    std::lock_guard<std::mutex> lk(mu);
    for (auto& [size, blocks] : free_blocks)
      for (void* p : blocks) unmap_block(p, size);
    free_blocks.clear();
    cached = 0;
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
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= n;
      return p;
    }
  }
  const auto get = [n] { return n >= k_min_cached ? map_block(n) : std::aligned_alloc(64, n); };
  void* p = get();
  if (!p) {
    // Cached blocks of other sizes may be what stands in the way.
    host_cache_release();
    p = get();
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
    if (c.cached + n <= c.limit) {
      c.free_blocks[n].push_back(p);
      c.cached += n;
      return;
    }
    return unmap_block(p, n);
  }
  std::free(p);
}

void host_cache_release() {
  the_cache().release();
}

std::size_t host_cache_bytes() {
  cache& c = the_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  return c.cached;
}

}  // namespace cleave::backend::detail
