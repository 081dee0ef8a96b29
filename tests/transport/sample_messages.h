// One well-formed sample of every message type, for round-trip tests and the fuzz seed corpus.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cleave/transport/message.h"

namespace cleave::transport::testing {

// (type name, finished message) for every member of the Body union, tensors filled with a
// deterministic pattern.
std::vector<std::pair<std::string, message_builder>> sample_messages();

// Bytes of the pattern at index i of a tensor's data (what sample_messages writes).
inline std::byte pattern_byte(std::size_t i) {
  return static_cast<std::byte>((i * 131u + 7u) & 0xffu);
}

}  // namespace cleave::transport::testing
