// Test helpers shared by the backend suites: moving host vectors in and out of any backend,
// seeded random data, and element-wise comparison with a readable failure message.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cleave/backend/registry.h"
#include "cleave/core/backend.h"
#include "cleave/core/random.h"

namespace cleave::testing {

// Names of the available backends other than `reference` (the oracle).
inline std::vector<std::string> backends_under_test() {
  std::vector<std::string> out;
  for (const auto& b : backend::list_backends())
    if (b.available && b.name != "reference") out.push_back(b.name);
  return out;
}

inline std::vector<float> random_vec(std::int64_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  core::rng r(seed);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = r.uniform(lo, hi);
  return v;
}

inline core::tensor make(core::backend& b, const core::shape& s, const std::vector<float>& v) {
  core::tensor t = b.empty(s, core::dtype::f32);
  if (static_cast<std::int64_t>(v.size()) != t.numel()) throw std::runtime_error("make: size mismatch");
  b.upload(t, v.data());
  return t;
}

template <class T>
core::tensor make_typed(core::backend& b, const core::shape& s, core::dtype t, const std::vector<T>& v) {
  core::tensor x = b.empty(s, t);
  b.upload(x, v.data());
  return x;
}

inline std::vector<float> read(core::backend& b, const core::tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  b.download(t, v.data());
  return v;
}

template <class T>
std::vector<T> read_typed(core::backend& b, const core::tensor& t) {
  std::vector<T> v(t.bytes() / sizeof(T));
  b.download(t, v.data());
  return v;
}

struct mismatch {
  bool ok = true;
  std::string message;
};

// |got - want| <= atol + rtol * |want| everywhere (NaN only matches NaN).
inline mismatch compare(const std::vector<float>& got, const std::vector<float>& want, float rtol, float atol) {
  if (got.size() != want.size())
    return {false, "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size())};
  std::size_t n_bad = 0, first = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) != std::isnan(g)) {
        if (!n_bad++) first = i;
      }
      continue;
    }
    const double err = std::fabs(g - w);
    if (err > atol + rtol * std::fabs(w)) {
      if (!n_bad++) first = i;
      worst = std::max(worst, err);
    }
  }
  if (!n_bad) return {};
  return {false, std::to_string(n_bad) + " of " + std::to_string(got.size()) + " differ; first at " +
                     std::to_string(first) + ": got " + std::to_string(got[first]) + " want " +
                     std::to_string(want[first]) + "; worst abs error " + std::to_string(worst)};
}

}  // namespace cleave::testing

// Checks two host vectors are close, naming what is compared.
#define CLEAVE_CHECK_CLOSE(got, want, rtol, atol, what)                        \
  do {                                                                         \
    const auto _m = ::cleave::testing::compare((got), (want), (rtol), (atol)); \
    INFO(what << ": " << _m.message);                                          \
    CHECK(_m.ok);                                                              \
  } while (0)
