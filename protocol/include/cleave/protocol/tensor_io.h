// Moving tensors between a backend and messages: received tensor views uploaded onto a
// backend, and backend tensors written straight into a message being built.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <string_view>
#include <vector>

#include "cleave/core/backend.h"
#include "cleave/transport/message.h"

namespace cleave::protocol {

// A received tensor on backend b (one copy: from the frame into the backend's buffer; an encoded
// one is decoded on the host first).
core::tensor to_backend(core::backend& b, const transport::tensor_view& v);
// Writes t into the message (one copy: from the backend straight into the frame).
flatbuffers::Offset<wire::Tensor> add_tensor(transport::message_builder& m, core::backend& b, const core::tensor& t,
                                             std::string_view name);
// Writes t (f32) encoded by spec. residual: topk's error feedback for this tensor's stream
// (resized and zeroed when the shape changes).
flatbuffers::Offset<wire::Tensor> add_tensor(transport::message_builder& m, core::backend& b, const core::tensor& t,
                                             std::string_view name, const core::codec_spec& spec,
                                             std::vector<float>* residual = nullptr);

}  // namespace cleave::protocol
