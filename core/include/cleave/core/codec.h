// Codecs for the tensors that cross a cut: activations going up and gradients coming down may
// each travel compressed. The numeric values are part of the wire format: never renumber.
//   f32   as computed (exact)
//   f16   IEEE half, round to nearest even
//   bf16  bfloat16, round to nearest even
//   int8  per-channel symmetric scale (channel = dim 1 of a rank >= 2 tensor), round to nearest
//         or, optionally, stochastic rounding
//   topk  the largest-magnitude fraction of the values with their positions (gradients only;
//         the sender keeps what it left out and adds it to the next gradient: error feedback)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cleave::core {

enum class codec : std::uint8_t { f32 = 0, f16 = 1, bf16 = 2, int8 = 3, topk = 4 };

inline constexpr int n_codecs = 5;

std::string_view codec_name(codec c);
std::optional<codec> codec_from_name(std::string_view name);
// Validates a raw value (from the network).
std::optional<codec> codec_from_int(std::uint32_t v);
// topk sparsifies gradients only; every other codec serves both directions.
constexpr bool codec_for_activations(codec c) {
  return c != codec::topk;
}

// The set of codecs a run may use: "f32", "f32,f16,int8", "topk:0.05" (the fraction kept by
// topk, default 0.1). Throws core::error naming the text. f32 is always allowed.
struct codec_set {
  std::vector<codec> allowed{codec::f32};
  float topk_fraction = 0.1f;

  bool allows(codec c) const;
  std::string str() const;
};
codec_set parse_codec_set(std::string_view text);

// Bytes a tensor of `numel` values with `channels` channels takes on the wire under codec c
// (payload only: values, scales, indices).
double encoded_bytes(codec c, double numel, double channels, float topk_fraction);

}  // namespace cleave::core
