// Element types of tensors: f32 for compute, the others as storage and wire types.
// The numeric values are part of the wire format and of checkpoints: never renumber.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace cleave::core {

enum class dtype : std::uint8_t { f32 = 0, f16 = 1, bf16 = 2, i8 = 3, u8 = 4, i32 = 5 };

inline constexpr int n_dtypes = 6;

// Bytes per element.
constexpr std::size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::f32:
      return 4;
    case dtype::f16:
      return 2;
    case dtype::bf16:
      return 2;
    case dtype::i8:
      return 1;
    case dtype::u8:
      return 1;
    case dtype::i32:
      return 4;
  }
  return 0;
}

std::string_view dtype_name(dtype t);
std::optional<dtype> dtype_from_name(std::string_view name);
// Validates a raw value (e.g. from the network or a file).
std::optional<dtype> dtype_from_int(std::uint32_t v);

}  // namespace cleave::core
