// CUDA backend: the int8 cut codec where the tensor lives (kernels in cuda_kernels_elementwise.cu,
// element formulas in cuda_device_math.h), so that a cut tensor leaves the GPU as one byte per
// value plus a scale per channel. f16 and bf16 need nothing here: they are cast().
#include <string>

#include "cleave/core/codec.h"
#include "cleave/core/error.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_tensor.h"

namespace cleave::backend::detail {

using core::tensor;
namespace k = cuda_kernels;

namespace {

void expect(const core::backend& b, const tensor& t, core::dtype d, std::int64_t numel, const char* what) {
  expect_mine(b, t, what);
  CLEAVE_ASSERT(t.dtype() == d && t.numel() == numel, std::string(what) + " has the wrong dtype or size");
}

}  // namespace

void cuda_backend::channel_absmax(const tensor& x, const tensor& amax) {
  const auto l = core::channel_layout_of(x.shape());
  expect(*this, x, core::dtype::f32, x.numel(), "channel_absmax: x");
  expect(*this, amax, core::dtype::f32, l.channels, "channel_absmax: amax");
  if (l.channels == 0) return;
  if (x.numel() == 0) return fill(amax, 0.0f);
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::channel_absmax(static_cast<const float*>(raw(x)), static_cast<float*>(raw(amax)), l.outer,
                                      l.channels, l.inner, stream_));
}

void cuda_backend::quantize_int8(const tensor& x, const tensor& inv, const tensor& q, bool stochastic,
                                 std::uint32_t seed) {
  const auto l = core::channel_layout_of(x.shape());
  expect(*this, x, core::dtype::f32, x.numel(), "quantize_int8: x");
  expect(*this, inv, core::dtype::f32, l.channels, "quantize_int8: inv");
  expect(*this, q, core::dtype::i8, x.numel(), "quantize_int8: q");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::quantize_int8(static_cast<const float*>(raw(x)), static_cast<const float*>(raw(inv)),
                                     static_cast<std::int8_t*>(raw(q)), l.outer, l.channels, l.inner, stochastic, seed,
                                     stream_));
}

void cuda_backend::dequantize_int8(const tensor& q, const tensor& scales, const tensor& y) {
  const auto l = core::channel_layout_of(q.shape());
  expect(*this, q, core::dtype::i8, q.numel(), "dequantize_int8: q");
  expect(*this, scales, core::dtype::f32, l.channels, "dequantize_int8: scales");
  expect(*this, y, core::dtype::f32, q.numel(), "dequantize_int8: y");
  device_guard g(device_);
  CLEAVE_CHECK_CUDA(k::dequantize_int8(static_cast<const std::int8_t*>(raw(q)), static_cast<const float*>(raw(scales)),
                                       static_cast<float*>(raw(y)), l.outer, l.channels, l.inner, stream_));
}

}  // namespace cleave::backend::detail
