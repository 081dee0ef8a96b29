#include "cleave/privacy/masked_replica.h"

#include <cmath>
#include <string>

#include "cleave/core/error.h"
#include "cleave/privacy/secagg.h"

namespace cleave::privacy {

namespace {

// Block b's parameter and state value counts.
std::pair<std::size_t, std::size_t> block_sizes(const core::flat_layout& lay, int b) {
  const auto i = static_cast<std::size_t>(b);
  return {static_cast<std::size_t>(lay.param_offset[i + 1] - lay.param_offset[i]),
          static_cast<std::size_t>(lay.buffer_offset[i + 1] - lay.buffer_offset[i])};
}

std::size_t block_words(const core::flat_layout& lay, int b) {
  const auto [np, nb] = block_sizes(lay, b);
  return 1 + np + nb;
}

void check_ranges(const core::flat_layout& lay, const block_ranges& ranges) {
  const int n = static_cast<int>(lay.param_offset.size()) - 1;
  int last = 0;
  for (const auto& [f, e] : ranges) {
    if (!(last <= f && f < e && e <= n))
      throw core::error("masked block range [" + std::to_string(f) + ", " + std::to_string(e) +
                        ") is empty, out of order or beyond the model's " + std::to_string(n) + " blocks");
    last = e;
  }
}

}  // namespace

std::size_t replica_words(const core::flat_layout& lay, const block_ranges& ranges) {
  check_ranges(lay, ranges);
  std::size_t n = 0;
  for (const auto& [f, e] : ranges)
    for (int b = f; b < e; ++b) n += block_words(lay, b);
  return n;
}

std::vector<std::uint64_t> encode_replica(const core::flat_layout& lay, const block_ranges& ranges,
                                          std::span<const held_segment> held, double weight) {
  std::vector<std::uint64_t> out(replica_words(lay, ranges), 0);
  std::size_t at = 0;
  for (const auto& [f, e] : ranges)
    for (int b = f; b < e; ++b) {
      const auto i = static_cast<std::size_t>(b);
      const auto [np, nb] = block_sizes(lay, b);
      const held_segment* seg = nullptr;
      for (const auto& h : held)
        if (h.first <= b && b < h.end) seg = &h;
      if (seg) {
        const auto p0 =
            static_cast<std::size_t>(lay.param_offset[i] - lay.param_offset[static_cast<std::size_t>(seg->first)]);
        const auto b0 =
            static_cast<std::size_t>(lay.buffer_offset[i] - lay.buffer_offset[static_cast<std::size_t>(seg->first)]);
        try {
          out[at] = to_fixed(weight);
          for (std::size_t k = 0; k < np; ++k) out[at + 1 + k] = to_fixed(weight * seg->params.at(p0 + k));
          for (std::size_t k = 0; k < nb; ++k) out[at + 1 + np + k] = to_fixed(weight * seg->buffers.at(b0 + k));
        } catch (const core::error& err) {
          throw core::error("block " + std::to_string(b) + ": " + err.what());
        }
      }
      at += 1 + np + nb;
    }
  return out;
}

std::vector<block_mean> decode_sum(const core::flat_layout& lay, const block_ranges& ranges,
                                   std::span<const std::uint64_t> words) {
  if (const std::size_t need = replica_words(lay, ranges); words.size() != need)
    throw core::error("masked sum of " + std::to_string(words.size()) + " words; its blocks need " +
                      std::to_string(need));
  std::vector<block_mean> out;
  std::size_t at = 0;
  for (const auto& [f, e] : ranges)
    for (int b = f; b < e; ++b) {
      const auto [np, nb] = block_sizes(lay, b);
      const double w = from_fixed(words[at]);
      if (w < 0 || std::abs(w - std::round(w)) > 1e-3)
        throw core::error("block " + std::to_string(b) + ": the summed weight " + std::to_string(w) +
                          " is not a sample count (a device masked with other keys?)");
      if (w >= 0.5) {
        block_mean m{b, std::round(w), std::vector<float>(np), std::vector<float>(nb)};
        for (std::size_t k = 0; k < np; ++k) m.params[k] = static_cast<float>(from_fixed(words[at + 1 + k]) / m.weight);
        for (std::size_t k = 0; k < nb; ++k)
          m.buffers[k] = static_cast<float>(from_fixed(words[at + 1 + np + k]) / m.weight);
        out.push_back(std::move(m));
      }
      at += 1 + np + nb;
    }
  return out;
}

}  // namespace cleave::privacy
