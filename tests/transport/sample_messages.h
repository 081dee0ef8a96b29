// One well-formed sample of every message type, built as nodes build them (the protocol's
// builders, the channel's own for Ping / Pong / Error): for round-trip tests and the fuzz seeds.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cleave/transport/message.h"

namespace cleave::transport::testing {

// (type name, finished message) for every member of the Body union, with the fields nodes fill
// (a RoundStart with its attempt and devices, a Plan with its route, codecs and training settings,
// a step message with its batch and attempt), tensors filled with deterministic values.
std::vector<std::pair<std::string, message_builder>> sample_messages();

// Step messages whose tensor is encoded by each codec (activations: f16, bf16, int8; gradients:
// f16, int8, topk at 10%), named "Activations_int8" etc.; their values before encoding are
// encoded_sample_values(), shape (3, 2, 5, 5).
std::vector<std::pair<std::string, message_builder>> encoded_step_messages();
std::vector<float> encoded_sample_values();

// The model spec the sample Plan carries (5 blocks).
const char* sample_model_json();

}  // namespace cleave::transport::testing
