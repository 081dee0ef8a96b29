// Helpers of the vulkan tests: skip (exit 77) without a Vulkan device, and run the same op on
// the vulkan and reference backends with identical inputs to compare the results.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cleave/backend/registry.h"
#include "cleave/core/backend.h"
#include "cleave/core/random.h"
#include "vk_device.h"
#include "vulkan_backend.h"

namespace cleave::test {

using core::shape;
using core::tensor;

// Exits with 77 (CTest: skipped) when this machine has no Vulkan device at all.
inline void require_vulkan() {
  for (const auto& b : backend::list_backends()) {
    if (b.name != "vulkan") continue;
    if (b.available) return;
    std::printf("skipped: no Vulkan device (%s)\n", b.detail.c_str());
    std::exit(77);
  }
  std::printf("skipped: this build has no vulkan backend\n");
  std::exit(77);
}

inline std::unique_ptr<backend::vk::vulkan_backend> make_vulkan(const std::string& device = "") {
  require_vulkan();
  auto b = backend::make_backend(device.empty() ? "vulkan" : "vulkan:" + device);
  return std::unique_ptr<backend::vk::vulkan_backend>(static_cast<backend::vk::vulkan_backend*>(b.release()));
}

// Validation-layer messages since this object was made must be zero when it goes away.
class no_validation_messages {
 public:
  no_validation_messages() : before_(backend::vk::validation_message_count()) {}
  ~no_validation_messages() { CHECK(backend::vk::validation_message_count() == before_); }

 private:
  std::uint64_t before_;
};

inline std::vector<float> random_values(std::int64_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  core::rng r(seed);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = r.uniform(lo, hi);
  return v;
}

template <class T>
std::vector<T> fetch(core::backend& b, const tensor& t) {
  std::vector<T> v(t.bytes() / sizeof(T));
  b.download(t, v.data());
  return v;
}

// The same tensor on both backends.
struct twin {
  tensor vk, ref;
};

// Both backends side by side.
struct pair_env {
  std::unique_ptr<backend::vk::vulkan_backend> vk = make_vulkan();
  std::unique_ptr<core::backend> ref = backend::make_backend("reference");
  std::uint64_t seed = 1;

  twin make(const shape& s, const std::vector<float>& values) {
    twin t{vk->empty(s), ref->empty(s)};
    REQUIRE(static_cast<std::int64_t>(values.size()) == s.numel());
    vk->upload(t.vk, values.data());
    ref->upload(t.ref, values.data());
    return t;
  }
  twin rand(const shape& s, float lo = -1.0f, float hi = 1.0f) {
    return make(s, random_values(s.numel(), seed++, lo, hi));
  }
  twin filled(const shape& s, float v) { return make(s, std::vector<float>(static_cast<std::size_t>(s.numel()), v)); }
  twin labels(std::int64_t n, std::int32_t k) {
    core::rng r(seed++);
    std::vector<std::int32_t> lab(static_cast<std::size_t>(n));
    for (auto& l : lab) l = static_cast<std::int32_t>(r.below(static_cast<std::uint64_t>(k)));
    twin t{vk->empty({n}, core::dtype::i32), ref->empty({n}, core::dtype::i32)};
    vk->upload(t.vk, lab.data());
    ref->upload(t.ref, lab.data());
    return t;
  }

  // Max over elements of |vk - ref| / (atol + rtol |ref|) must be <= 1.
  void expect_close(const twin& t, float rtol, float atol, const char* what) {
    const auto a = fetch<float>(*vk, t.vk), b = fetch<float>(*ref, t.ref);
    REQUIRE(a.size() == b.size());
    double worst = 0.0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
      const double err = both_nan ? 0.0 : std::fabs(double(a[i]) - b[i]) / (atol + rtol * std::fabs(double(b[i])));
      if (!(err <= worst)) {
        worst = std::isnan(err) ? 1e30 : err;
        at = i;
      }
    }
    INFO(what << ": worst at " << at << ": vulkan " << (a.empty() ? 0.f : a[at]) << " reference "
              << (b.empty() ? 0.f : b[at]));
    CHECK(worst <= 1.0);
  }
  void expect_equal(const twin& t, const char* what) {
    const auto a = fetch<std::uint8_t>(*vk, t.vk), b = fetch<std::uint8_t>(*ref, t.ref);
    REQUIRE(a.size() == b.size());
    std::size_t first = a.size();
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i]) {
        first = i;
        break;
      }
    INFO(what << ": first differing byte " << first << " of " << a.size());
    CHECK(first == a.size());
  }
};

}  // namespace cleave::test
