// Seeded training-time augmentation (random crop with padding, horizontal flip) applied while a
// batch is drawn from the u8 samples.
#include <algorithm>
#include <charconv>
#include <string>

#include "cleave/core/dataset.h"
#include "cleave/core/error.h"
#include "cleave/core/random.h"

namespace cleave::core {

augment_config parse_augment(std::string_view text) {
  auto bad = [&] {
    return error("augment '" + std::string(text) +
                 "': expected crop, crop:PAD, flip or both separated by ',' (e.g. crop,flip), or none");
  };
  augment_config a;
  if (text == "none") return a;
  if (text.empty()) throw bad();
  std::string_view rest = text;
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    if (item == "flip" && !a.flip) {
      a.flip = true;
    } else if (item.starts_with("crop") && !a.crop) {
      a.crop = true;
      if (item.size() > 4) {
        if (item[4] != ':') throw bad();
        const std::string_view num = item.substr(5);
        const auto r = std::from_chars(num.data(), num.data() + num.size(), a.pad);
        if (num.empty() || r.ec != std::errc{} || r.ptr != num.data() + num.size()) throw bad();
        if (a.pad < 1 || a.pad > 1024)
          throw error("augment '" + std::string(text) + "': crop padding must be in [1, 1024], got " +
                      std::to_string(a.pad));
      }
    } else {
      throw bad();
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return a;
}

std::string augment_str(const augment_config& a) {
  if (!a.any()) return "none";
  std::string s;
  if (a.crop) s = "crop:" + std::to_string(a.pad);
  if (a.flip) s += s.empty() ? "flip" : ",flip";
  return s;
}

augment_draw draw_augment(const augment_config& a, std::uint64_t seed, std::int64_t epoch, std::int64_t sample) {
  // One counter-based hash per (seed, epoch, sample); the crop and the flip take bits of their
  // own, so turning one on or off leaves the other's choices as they were.
  const std::uint64_t h = mix64(mix64(mix64(seed ^ 0xa06e47a7ULL) ^ static_cast<std::uint64_t>(epoch)) ^
                                static_cast<std::uint64_t>(sample));
  augment_draw d;
  if (a.crop) {
    const auto span = static_cast<std::uint64_t>(2 * a.pad + 1);
    d.dy = static_cast<int>(((h & 0xffffffffULL) * span) >> 32);
    d.dx = static_cast<int>(((h >> 32) * span) >> 32);
  }
  if (a.flip) d.flip = (mix64(h) & 1) != 0;
  return d;
}

void dataset::gather(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out,
                     const augment_config& a, std::uint64_t seed, std::int64_t epoch) const {
  if (!a.any()) return gather(idx, n, x_out, y_out);
  CLEAVE_ASSERT(item.rank() == 3 && (!a.crop || a.pad >= 0), "augmenting (C,H,W) samples");
  const auto c = static_cast<std::size_t>(item[0]);
  const std::int64_t h = item[1], w = item[2];
  const auto hw = static_cast<std::size_t>(h * w), per = c * hw;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto s = static_cast<std::size_t>(idx[i]);
    const augment_draw d = draw_augment(a, seed, epoch, idx[i]);
    // Output (r, col) shows the padded image at (r + dy, col' + dx), col' mirrored when flipped:
    // the source pixel (r + oy, col' + ox), a 0 pixel where that falls in the padding.
    const std::int64_t oy = a.crop ? d.dy - a.pad : 0, ox = a.crop ? d.dx - a.pad : 0;
    const std::uint8_t* p = pixels.data() + s * per;
    float* x = x_out + static_cast<std::size_t>(i) * per;
    for (std::size_t ch = 0; ch < c; ++ch) {
      const float* t = table.data() + ch * 256;
      const std::uint8_t* src = p + ch * hw;
      float* dst = x + ch * hw;
      for (std::int64_t r = 0; r < h; ++r, dst += w) {
        const std::int64_t sr = r + oy;
        if (sr < 0 || sr >= h) {
          std::fill(dst, dst + w, t[0]);
          continue;
        }
        const std::uint8_t* row = src + sr * w;
        for (std::int64_t col = 0; col < w; ++col) {
          const std::int64_t sc = (d.flip ? w - 1 - col : col) + ox;
          dst[col] = sc >= 0 && sc < w ? t[row[sc]] : t[0];
        }
      }
    }
    y_out[i] = y[s];
  }
}

}  // namespace cleave::core
