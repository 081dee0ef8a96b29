// Codecs for the tensors that cross a cut: activations going up and gradients coming down may
// each travel compressed. The numeric values are part of the wire format: never renumber.
//   f32   as computed (exact)
//   f16   IEEE half, round to nearest even
//   bf16  bfloat16, round to nearest even
//   int8  per-channel symmetric scale (channel = dim 1 of a rank >= 2 tensor), round to nearest
//         or, optionally, stochastic rounding
//   topk  the largest-magnitude fraction of the values with their positions (gradients only);
//         optionally with error feedback: the sender keeps what it left out and adds it to the
//         next gradient of the same stream
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cleave/core/shape.h"

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

// The codecs of one hop of a route: the activation going up, the gradient coming down.
struct hop_codecs {
  codec up = codec::f32, down = codec::f32;
  friend bool operator==(const hop_codecs&, const hop_codecs&) = default;
};

// The set of codecs a run may use: "f32", "f32,f16,int8", "topk:0.05" (the fraction kept by
// topk, default 0.1), "topk:0.05:feedback" (with error feedback), "int8:stochastic". Throws
// core::error naming the text. f32 is always allowed.
struct codec_set {
  std::vector<codec> allowed{codec::f32};
  float topk_fraction = 0.1f;

  bool stochastic = false;     // "int8:stochastic": int8 rounds stochastically
  bool topk_feedback = false;  // "topk:feedback": what topk leaves out is added to the next gradient

  bool allows(codec c) const;
  std::string str() const;
};
codec_set parse_codec_set(std::string_view text);
// The codecs of a hop when nothing chooses among them (a fixed plan): per direction the allowed
// codec that puts the fewest bytes on the wire (ties: the one listed first).
hop_codecs compact_codecs(const codec_set& s);

// Bytes a tensor of `numel` values with `channels` channels takes on the wire under codec c
// (payload only: values, scales, indices).
double encoded_bytes(codec c, double numel, double channels, float topk_fraction);

}  // namespace cleave::core

// ---- Encoding and decoding on the host (vectorisable loops; values are f32) ----
namespace cleave::core {

// How one tensor is encoded.
struct codec_spec {
  codec id = codec::f32;
  float topk_fraction = 0.1f;
  bool stochastic = false;  // int8: stochastic rounding instead of round to nearest
  std::uint32_t seed = 0;   // int8 stochastic rounding: the draw of this tensor
};

// Channels of a tensor of shape dims (dim 1 of rank >= 2, else 1) and values per channel slice.
struct channel_layout {
  std::int64_t outer = 1, channels = 1, inner = 1;  // numel = outer * channels * inner
};
channel_layout channel_layout_of(const std::int64_t* dims, int rank);
// The same for a tensor of shape s.
channel_layout channel_layout_of(const shape& s);

void encode_f16(const float* x, std::uint16_t* out, std::int64_t n);
void decode_f16(const std::uint16_t* in, float* y, std::int64_t n);
void encode_bf16(const float* x, std::uint16_t* out, std::int64_t n);
void decode_bf16(const std::uint16_t* in, float* y, std::int64_t n);
// One scale per channel: max |x| over the channel / 127 (0 for an all-zero channel); q = x / scale
// rounded and saturated to [-127, 127]. A non-finite value makes its channel's scale NaN, so that
// the receiver sees it (as it would see the f32 value). The three steps below, in this order.
void encode_int8(const float* x, const channel_layout& l, std::int8_t* q, float* scales, bool stochastic,
                 std::uint32_t seed);
// amax[c] = max |x| over channel c; NaN where the channel holds a non-finite value.
void channel_absmax(const float* x, const channel_layout& l, float* amax);
// scales[c] = amax[c] / 127; inv[c] = 1 / scales[c], 0 where scales[c] is not > 0 (zero or NaN).
void int8_scales(const float* amax, std::int64_t channels, float* scales, float* inv);
// q[e] = clamp(nearbyint(x[e] * inv[c]), -127, 127), 0 where that is NaN; stochastic:
// clamp(floor(x[e] * inv[c] + u), -127, 127) with u = (hash32(seed, e) >> 8) / 2^24 (e: the flat index).
void quantize_int8(const float* x, const channel_layout& l, const float* inv, std::int8_t* q, bool stochastic,
                   std::uint32_t seed);
void decode_int8(const std::int8_t* q, const float* scales, const channel_layout& l, float* y);
// Values kept by topk for n values.
std::int64_t topk_count(std::int64_t n, float fraction);
// The k values of largest magnitude of x + residual (ties: lower position first), written with
// their positions in increasing order; residual becomes what was left out (error feedback).
// residual may be null (no feedback).
void encode_topk(const float* x, std::int64_t n, std::int64_t k, float* residual, float* values,
                 std::uint32_t* positions);
void decode_topk(const float* values, const std::uint32_t* positions, std::int64_t k, float* y, std::int64_t n);

}  // namespace cleave::core
