// Seeded training-time augmentation of image samples (crop with padding, horizontal flip): the
// settings, their text form, and the draws one sample gets.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace cleave::core {

// Training-time augmentation of a drawn sample, in this order:
// - crop: the image padded by `pad` pixels on every side and a window of its own size cut at a
//   random offset in [0, 2 * pad] on each axis. The padding holds pixel value 0 (black) before
//   normalisation, as torchvision's RandomCrop(size, padding) does on the image ahead of
//   Normalize: a padded value is the normalised value of a 0 pixel in its channel, not 0.
// - flip: mirrored left to right with probability 1/2.
// The choices for a sample depend only on (seed, epoch, the sample's index in the data set it
// is drawn from): the same on every machine and backend, whatever the batch or thread count.
struct augment_config {
  bool crop = false;
  int pad = 4;  // crop padding in pixels, >= 1
  bool flip = false;

  bool any() const { return crop || flip; }
};

// "crop,flip" (the usual CIFAR recipe), "crop", "crop:PAD", "flip", combinations separated by
// ',' in any order, or "none". Errors name the text.
augment_config parse_augment(std::string_view text);
// The text parse_augment reads back: "none", or e.g. "crop:4,flip".
std::string augment_str(const augment_config& a);

// What augmentation does to one sample: the crop window's offset into the padded image (0 when
// there is no crop) and whether it is mirrored.
struct augment_draw {
  int dy = 0, dx = 0;  // in [0, 2 * pad] when cropping
  bool flip = false;
};
augment_draw draw_augment(const augment_config& a, std::uint64_t seed, std::int64_t epoch, std::int64_t sample);

}  // namespace cleave::core
