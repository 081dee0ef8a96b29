// The words of a device's masked replica upload: for every block of the mask set's ranges, in
// order, its weight (the samples behind it; 0 for a block the device does not hold), then the
// weight times each of its parameters, then times each of its state values, in fixed point
// (secagg.h). Summed over devices they give per block the total weight and the weighted sums.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "cleave/core/model.h"

namespace cleave::privacy {

using block_ranges = std::vector<std::pair<int, int>>;

// Words of an upload covering `ranges` of a model with layout `lay`.
std::size_t replica_words(const core::flat_layout& lay, const block_ranges& ranges);

// A segment a device holds: blocks [first, end) with their flat values (stage layout).
struct held_segment {
  int first = 0, end = 0;
  std::vector<float> params, buffers;
};

// The unmasked words of a device's upload. Segments outside `ranges` are left out; throws
// core::error naming the block when a value times the weight is not finite or too large for the
// fixed-point encoding.
std::vector<std::uint64_t> encode_replica(const core::flat_layout& lay, const block_ranges& ranges,
                                          std::span<const held_segment> held, double weight);

// One block of the unmasked sum: its total weight and the weighted means of its values.
struct block_mean {
  int block = 0;
  double weight = 0;
  std::vector<float> params, buffers;
};
// The blocks of an unmasked sum with a weight > 0. Throws core::error when the word count does
// not match `ranges` or a block's weight decodes negative or not a whole number of samples.
std::vector<block_mean> decode_sum(const core::flat_layout& lay, const block_ranges& ranges,
                                   std::span<const std::uint64_t> words);

}  // namespace cleave::privacy
