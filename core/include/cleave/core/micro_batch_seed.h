// The seeds of the random streams of one micro-batch of a device's split step (dropout, codec
// rounding, label-group targets, noise at the cut), derived in this one place.
#pragma once

#include <cstdint>

#include "cleave/core/random.h"

namespace cleave::core {

// What a micro-batch's stream is for. Each keeps the formula it was introduced with, so that every
// stream draws the numbers it always drew (tests compare runs with oracles derived the same way).
// With key = (device << 40) ^ (step << 8) ^ micro_batch:
enum class stream : std::uint8_t {
  // hash32(step, micro_batch): 32-bit arithmetic only; the same on every device and tier, and
  // neither `base` nor `device` enters it.
  dropout,
  // hash32(hash32(step, micro_batch), device): the stochastic rounding of a hop's codec; no `base`.
  codec,
  // The high 32 bits of mix64(0x6c6162656c73 ("labels") ^ mix64(key)): the sub-class targets under
  // label groups, wherever the loss runs; no `base`.
  label_groups,
  // mix64(base ^ mix64(key)): the noise on gradients leaving a device's own loss.
  label_noise,
  // mix64(base ^ 0x6163746976617465 ("activate") ^ mix64(key)): the noise on a device's
  // activations at its bottom cut.
  activation_noise,
};

// The seed of stream `s` of micro-batch `micro_batch` of `device`'s step `step`; the 32-bit streams
// (dropout, codec, label_groups) fit in std::uint32_t.
constexpr std::uint64_t micro_batch_seed(std::uint64_t base, std::uint32_t device, std::uint64_t step,
                                         std::uint32_t micro_batch, stream s) {
  const std::uint32_t step32 = static_cast<std::uint32_t>(step);
  const std::uint64_t key = mix64((std::uint64_t{device} << 40) ^ (step << 8) ^ micro_batch);
  switch (s) {
    case stream::dropout:
      return hash32(step32, micro_batch);
    case stream::codec:
      return hash32(hash32(step32, micro_batch), device);
    case stream::label_groups:
      return mix64(0x6c6162656c73ULL ^ key) >> 32;
    case stream::label_noise:
      return mix64(base ^ key);
    case stream::activation_noise:
      return mix64(base ^ 0x6163746976617465ULL ^ key);
  }
  return 0;
}

}  // namespace cleave::core
