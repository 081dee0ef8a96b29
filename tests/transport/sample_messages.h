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

// Step messages whose tensor is encoded by each codec (activations: f16, bf16, int8; gradients:
// f16, int8, topk at 10%), named "Activations_int8" etc.; their values before encoding are
// encoded_sample_values(), shape (3, 2, 5, 5).
std::vector<std::pair<std::string, message_builder>> encoded_step_messages();
std::vector<float> encoded_sample_values();

// Bytes of the pattern at index i of a tensor's data (what sample_messages writes).
inline std::byte pattern_byte(std::size_t i) {
  return static_cast<std::byte>((i * 131u + 7u) & 0xffu);
}

}  // namespace cleave::transport::testing
