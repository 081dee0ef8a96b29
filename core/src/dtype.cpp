// Names of element types.
#include "cleave/core/dtype.h"

#include <array>

namespace cleave::core {

namespace {
constexpr std::array<std::string_view, n_dtypes> names = {"f32", "f16", "bf16", "i8", "u8", "i32"};
}

std::string_view dtype_name(dtype t) {
  const auto i = static_cast<std::size_t>(t);
  return i < names.size() ? names[i] : std::string_view{"?"};
}

std::optional<dtype> dtype_from_name(std::string_view name) {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<dtype>(i);
  return std::nullopt;
}

std::optional<dtype> dtype_from_int(std::uint32_t v) {
  if (v < static_cast<std::uint32_t>(n_dtypes)) return static_cast<dtype>(v);
  return std::nullopt;
}

}  // namespace cleave::core
