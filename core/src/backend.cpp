// Backend-independent helpers of the backend interface.
#include "cleave/core/backend.h"

#include <cmath>
#include <string>

namespace cleave::core {

conv_dims conv_dims_of(const conv2d_desc& d, const tensor& x, const tensor& w, const tensor& y) {
  const auto &xs = x.shape(), &ws = w.shape(), &ys = y.shape();
  CLEAVE_ASSERT(xs.rank() == 4 && ws.rank() == 4 && ys.rank() == 4, "conv2d needs 4-D tensors");
  conv_dims c{xs[0], xs[1], xs[2], xs[3], ws[0], ws[2], ws[3], ys[2], ys[3], d.groups};
  CLEAVE_ASSERT(d.groups >= 1 && c.c % d.groups == 0 && c.k % d.groups == 0, "conv2d groups must divide C and K");
  CLEAVE_ASSERT(ws[1] * d.groups == c.c && ys[0] == c.n && ys[1] == c.k, "conv2d channel/batch mismatch");
  CLEAVE_ASSERT(d.stride_h >= 1 && d.stride_w >= 1 && d.pad_h >= 0 && d.pad_w >= 0, "conv2d stride/padding");
  CLEAVE_ASSERT(c.p == window_out(c.h, static_cast<int>(c.r), d.stride_h, d.pad_h) &&
                    c.q == window_out(c.w, static_cast<int>(c.s), d.stride_w, d.pad_w),
                "conv2d output size mismatch");
  return c;
}

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
