// A frame's bytes copied into a fresh 32-byte aligned receive buffer, as the channel would
// hand them to decode_frame.
#pragma once

#include <doctest/doctest.h>

#include <cstring>
#include <span>

#include "cleave/transport/message.h"

namespace cleave::transport::testing {

inline aligned_bytes aligned_copy(std::span<const std::byte> bytes) {
  aligned_bytes b = aligned_bytes::allocate(bytes.size());
  REQUIRE(!b.empty());
  std::memcpy(b.data(), bytes.data(), bytes.size());
  return b;
}

}  // namespace cleave::transport::testing
