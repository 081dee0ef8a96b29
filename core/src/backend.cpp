// Backend-independent helpers of the backend interface.
#include "cleave/core/backend.h"

#include <cmath>
#include <string>

namespace cleave::core {

tensor backend::empty(const shape& s, dtype t) {
  const auto bytes = static_cast<std::size_t>(s.numel()) * dtype_size(t);
  return tensor(allocate(bytes), 0, s, t);
}

tensor backend::zeros(const shape& s, dtype t) {
  tensor x = empty(s, t);
  if (t == dtype::f32) {
    fill(x, 0.0f);
  } else {
    tensor tmp = empty(s, dtype::f32);
    fill(tmp, 0.0f);
    cast(tmp, x);
  }
  return x;
}

std::uint32_t dropout_threshold(float p) {
  const double keep = 1.0 - static_cast<double>(p);
  if (keep <= 0.0) return 0;
  const double t = std::floor(keep * 4294967296.0);
  return t >= 4294967295.0 ? 4294967295u : static_cast<std::uint32_t>(t);
}

void expect_f32(const backend& b, const tensor& t, const char* what) {
  CLEAVE_ASSERT(t.defined(), std::string(what) + " is undefined");
  CLEAVE_ASSERT(t.owner() == &b, std::string(what) + " belongs to another backend");
  CLEAVE_ASSERT(t.dtype() == dtype::f32, std::string(what) + " is not f32");
}

}  // namespace cleave::core
