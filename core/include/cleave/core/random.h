// Seeded, platform-independent random numbers: the same seed gives the same stream on every
// machine and backend (no std:: distributions, whose output is implementation-defined).
#pragma once

#include <cstdint>

namespace cleave::core {

// Stateless 64-bit mix (splitmix64 finaliser): hash(seed, counter) style randomness.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Counter-based uniform in [0,1) from (seed, index), using 32-bit arithmetic only so GPU
// shaders can reproduce it exactly: see dropout_keep().
constexpr std::uint32_t hash32(std::uint32_t seed, std::uint32_t index) {
  std::uint32_t h = seed ^ 0x9e3779b9u;
  h ^= index + 0x7f4a7c15u + (h << 6) + (h >> 2);
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}

// Dropout decision shared by every backend: element `index` is kept when this returns true.
// keep_threshold = (1 - p) * 2^32, clamped to [0, 2^32 - 1].
constexpr bool dropout_keep(std::uint32_t seed, std::uint32_t index, std::uint32_t keep_threshold) {
  return hash32(seed, index) < keep_threshold;
}

// Sequential generator for host-side work (initialisation, shuffling, partitioning).
class rng {
 public:
  explicit rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next_u64() {
    const std::uint64_t s = state_;
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix64(s);  // splitmix64
  }
  // Uniform in [0, 1) with 24 random bits (exact in float).
  float uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }
  // Uniform in [a, b).
  float uniform(float a, float b) { return a + (b - a) * uniform(); }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply, negligible bias for our n).
  std::uint64_t below(std::uint64_t n) {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64);
  }
  // Standard normal (Box-Muller on doubles; deterministic across platforms with IEEE libm).
  double normal();
  // Gamma(shape, 1) for Dirichlet sampling (Marsaglia-Tsang).
  double gamma(double shape);

 private:
  std::uint64_t state_;
};

}  // namespace cleave::core
