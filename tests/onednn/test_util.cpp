// Helpers for the onednn tests.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "test_util.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

namespace cleave::test {

twin backends::random(const core::shape& s, core::rng& g, float lo, float hi) {
  std::vector<float> v(static_cast<std::size_t>(s.numel()));
  for (auto& x : v) x = g.uniform(lo, hi);
  return from(s, v);
}

twin backends::filled(const core::shape& s, float value) {
  return from(s, std::vector<float>(static_cast<std::size_t>(s.numel()), value));
}

twin backends::from(const core::shape& s, const std::vector<float>& v) {
  twin t{ref.empty(s), dnn.empty(s)};
  ref.upload(t.r, v.data());
  dnn.upload(t.d, v.data());
  return t;
}

std::vector<float> values(core::backend& b, const core::tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  b.download(t, v.data());
  return v;
}

double rel_error(backends& b, const twin& t) {
  const auto r = values(b.ref, t.r), d = values(b.dnn, t.d);
  double diff = 0.0, mag = 0.0;
  for (std::size_t i = 0; i < r.size(); ++i) {
    const double e = std::fabs(static_cast<double>(d[i]) - r[i]);
    diff = std::isnan(e) ? INFINITY : std::max(diff, e);
    mag = std::max(mag, std::fabs(static_cast<double>(r[i])));
  }
  return diff / (1.0 + mag);
}

}  // namespace cleave::test
