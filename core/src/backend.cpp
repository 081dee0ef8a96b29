// Backend-independent helpers of the backend interface.
#include "cleave/core/backend.h"

#include <cmath>
#include <string>
#include <vector>

#include "cleave/core/codec.h"

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

// ---- cut codecs: the defaults, on the host ----------------------------------------------------

namespace {

void expect_codec_tensor(const backend& b, const tensor& t, dtype want, std::int64_t numel, const char* what) {
  CLEAVE_ASSERT(t.defined() && t.owner() == &b, std::string(what) + " is undefined or of another backend");
  CLEAVE_ASSERT(t.dtype() == want && t.numel() == numel, std::string(what) + " has the wrong dtype or size");
}

// A tensor's values on the host: in place on host memory, else a downloaded copy that put()
// uploads back.
template <class T>
class host_view {
 public:
  host_view(backend& b, const tensor& t, bool read) : b_(b), t_(t) {
    if (b.host_memory()) {
      b.synchronize();  // issued work may still read or write it
      b.make_row_major(t);
      p_ = t.host<T>();
      return;
    }
    copy_.resize(static_cast<std::size_t>(t.numel()));
    if (read && !copy_.empty()) b.download(t, copy_.data());
    p_ = copy_.data();
  }
  T* get() const { return p_; }
  void put() {
    if (!b_.host_memory() && !copy_.empty()) b_.upload(t_, copy_.data());
  }

 private:
  backend& b_;
  const tensor& t_;
  std::vector<T> copy_;
  T* p_ = nullptr;
};

}  // namespace

void backend::channel_absmax(const tensor& x, const tensor& amax) {
  const auto l = channel_layout_of(x.shape());
  expect_codec_tensor(*this, x, dtype::f32, x.numel(), "channel_absmax: x");
  expect_codec_tensor(*this, amax, dtype::f32, l.channels, "channel_absmax: amax");
  host_view<float> in(*this, x, true), out(*this, amax, false);
  core::channel_absmax(in.get(), l, out.get());
  out.put();
}

void backend::quantize_int8(const tensor& x, const tensor& inv, const tensor& q, bool stochastic, std::uint32_t seed) {
  const auto l = channel_layout_of(x.shape());
  expect_codec_tensor(*this, x, dtype::f32, x.numel(), "quantize_int8: x");
  expect_codec_tensor(*this, inv, dtype::f32, l.channels, "quantize_int8: inv");
  expect_codec_tensor(*this, q, dtype::i8, x.numel(), "quantize_int8: q");
  host_view<float> in(*this, x, true), scale(*this, inv, true);
  host_view<std::int8_t> out(*this, q, false);
  core::quantize_int8(in.get(), l, scale.get(), out.get(), stochastic, seed);
  out.put();
}

void backend::dequantize_int8(const tensor& q, const tensor& scales, const tensor& y) {
  const auto l = channel_layout_of(q.shape());
  expect_codec_tensor(*this, q, dtype::i8, q.numel(), "dequantize_int8: q");
  expect_codec_tensor(*this, scales, dtype::f32, l.channels, "dequantize_int8: scales");
  expect_codec_tensor(*this, y, dtype::f32, q.numel(), "dequantize_int8: y");
  host_view<std::int8_t> in(*this, q, true);
  host_view<float> s(*this, scales, true), out(*this, y, false);
  core::decode_int8(in.get(), s.get(), l, out.get());
  out.put();
}

}  // namespace cleave::core
