// Helpers for the onednn tests: the same random tensor on the reference and onednn backends,
// and a comparison scaled to the magnitude of the reference result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cleave/core/random.h"
#include "onednn_backend.h"

namespace cleave::test {

using backend::detail::onednn_backend;
using backend::detail::reference_backend;

// One logical tensor held by both backends: `r` on reference, `d` on onednn.
struct twin {
  core::tensor r, d;
};

struct backends {
  explicit backends(backend::detail::onednn_options o = {}) : dnn(o) {}

  reference_backend ref;
  onednn_backend dnn;

  // Uniform values in [lo, hi), identical on both backends.
  twin random(const core::shape& s, core::rng& g, float lo = -1.0f, float hi = 1.0f);
  twin filled(const core::shape& s, float value);
  twin from(const core::shape& s, const std::vector<float>& values);
};

std::vector<float> values(core::backend& b, const core::tensor& t);

// max |dnn - ref| / (1 + max |ref|): float rounding of sums of up to a few thousand terms
// stays far below 1e-4 of the magnitude.
double rel_error(backends& b, const twin& t);

}  // namespace cleave::test
