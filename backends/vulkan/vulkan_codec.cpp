// vulkan backend: the int8 cut codec where the tensor lives (shaders int8_absmax, int8_quantize,
// int8_dequantize), so that a cut tensor leaves the device as one byte per value plus a scale
// per channel. f16 and bf16 need nothing here: they are cast().
#include <algorithm>
#include <string>

#include "cleave/core/codec.h"
#include "cleave/core/error.h"
#include "vulkan_backend.h"

namespace cleave::backend::vk {

using core::tensor;

namespace {

std::uint32_t u32_of(std::int64_t v) {
  CLEAVE_ASSERT(v >= 0 && v <= 0xffffffffLL, "size does not fit the 32-bit indexing of the vulkan shaders");
  return static_cast<std::uint32_t>(v);
}

void expect(const core::backend& b, const tensor& t, core::dtype d, std::int64_t numel, const char* what) {
  CLEAVE_ASSERT(t.defined() && t.owner() == &b, std::string(what) + " is undefined or of another backend");
  CLEAVE_ASSERT(t.dtype() == d && t.numel() == numel, std::string(what) + " has the wrong dtype or size");
}

}  // namespace

void vulkan_backend::channel_absmax(const tensor& x, const tensor& amax) {
  const auto l = core::channel_layout_of(x.shape());
  expect(*this, x, core::dtype::f32, x.numel(), "channel_absmax: x");
  expect(*this, amax, core::dtype::f32, l.channels, "channel_absmax: amax");
  if (l.channels == 0) return;
  if (x.numel() == 0) return fill(amax, 0.0f);
  const bound bx = bind(x, false), ba = bind(amax, true);
  const struct {
    std::uint32_t outer, channels, inner, off_x, off_a;
  } pc{u32_of(l.outer), u32_of(l.channels), u32_of(l.inner), bx.word, ba.word};
  run("int8_absmax", {bx, ba}, pc, static_cast<std::uint32_t>(std::min<std::int64_t>(l.channels, 65535)));
}

void vulkan_backend::quantize_int8(const tensor& x, const tensor& inv, const tensor& q, bool stochastic,
                                   std::uint32_t seed) {
  const auto l = core::channel_layout_of(x.shape());
  expect(*this, x, core::dtype::f32, x.numel(), "quantize_int8: x");
  expect(*this, inv, core::dtype::f32, l.channels, "quantize_int8: inv");
  expect(*this, q, core::dtype::i8, x.numel(), "quantize_int8: q");
  if (x.numel() == 0) return;
  const bound bx = bind(x, false), bi = bind(inv, false), bq = bind(q, true);
  const std::uint32_t first = bq.byte / 4, last = u32_of((static_cast<std::int64_t>(bq.byte) + x.numel() + 3) / 4);
  const struct {
    std::uint32_t n, channels, inner, off_x, off_inv, q_byte, first_word, n_words, stochastic, seed;
  } pc{u32_of(x.numel()),
       u32_of(l.channels),
       u32_of(l.inner),
       bx.word,
       bi.word,
       bq.byte,
       first,
       last - first,
       stochastic ? 1u : 0u,
       seed};
  run("int8_quantize", {bx, bi, bq}, pc, groups_for(pc.n_words));
}

void vulkan_backend::dequantize_int8(const tensor& q, const tensor& scales, const tensor& y) {
  const auto l = core::channel_layout_of(q.shape());
  expect(*this, q, core::dtype::i8, q.numel(), "dequantize_int8: q");
  expect(*this, scales, core::dtype::f32, l.channels, "dequantize_int8: scales");
  expect(*this, y, core::dtype::f32, q.numel(), "dequantize_int8: y");
  if (q.numel() == 0) return;
  const bound bq = bind(q, false), bs = bind(scales, false), by = bind(y, true);
  const struct {
    std::uint32_t n, channels, inner, q_byte, off_s, off_y;
  } pc{u32_of(q.numel()), u32_of(l.channels), u32_of(l.inner), bq.byte, bs.word, by.word};
  run("int8_dequantize", {bq, bs, by}, pc, groups_for(q.numel()));
}

}  // namespace cleave::backend::vk
