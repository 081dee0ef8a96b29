// The envelope of every message: the builder that writes a frame (tensor bytes straight into its
// buffer), the channel's own messages (Ping, Pong, Error) and the verified view of a received frame.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "cleave/core/codec.h"
#include "cleave/core/dtype.h"
#include "cleave/core/shape.h"
#include "cleave/transport/frame.h"
#include "cleave/transport/result.h"
#include "cleave/wire/wire_generated.h"

namespace cleave::transport {

// A tensor to write into a message: its bytes are copied once, from `data` into the frame.
// `data` holds shape.numel() * dtype_size(dtype) bytes on the host.
struct tensor_source {
  core::dtype dtype = core::dtype::f32;
  core::shape shape;
  const void* data = nullptr;
  std::string_view name;
};

// Builds one message. Tensor payloads are placed 32-byte aligned and written in place, either
// from host memory (tensor_source) or by a fill callback (e.g. a device-to-host copy).
class message_builder {
 public:
  // `initial_bytes`: the expected frame size; a good estimate avoids regrowing (a copy).
  explicit message_builder(std::size_t initial_bytes = 1024);

  // A builder holding a copy of a whole frame (a received message passed on unchanged).
  static message_builder from_frame(std::span<const std::byte> frame);

  flatbuffers::FlatBufferBuilder& fbb() { return fbb_; }

  // Writes a tensor whose bytes are produced by `fill(std::span<std::byte> dst)`; dst has
  // shape.numel() * dtype_size(t) bytes and is 32-byte aligned relative to the frame start.
  template <class Fill>
  flatbuffers::Offset<wire::Tensor> add_tensor(core::dtype t, const core::shape& s, std::string_view name,
                                               Fill&& fill) {
    const pending_tensor p = begin_tensor(t, s, name);
    fill(std::span<std::byte>(p.data, p.bytes));
    return end_tensor(p, t);
  }
  flatbuffers::Offset<wire::Tensor> add_tensor(const tensor_source& src);
  // Writes n = s.numel() host f32 values encoded by spec (see core/codec.h); residual (n values
  // or null) is topk's error feedback, updated in place.
  flatbuffers::Offset<wire::Tensor> add_encoded_tensor(const core::codec_spec& spec, const core::shape& s,
                                                       std::string_view name, const float* values, float* residual);
  // A tensor encoded by codec c (f16, bf16 or int8) elsewhere, e.g. by the backend that holds it:
  // `fill` writes its s.numel() codes (2 bytes each for f16 / bf16, 1 for int8) into the span it
  // is given; int8 carries its per-channel scales.
  template <class Fill>
  flatbuffers::Offset<wire::Tensor> add_coded_tensor(core::codec c, const core::shape& s, std::string_view name,
                                                     Fill&& fill, std::span<const float> scales = {}) {
    const pending_tensor p = begin_tensor(coded_dtype(c), s, name);
    fill(std::span<std::byte>(p.data, p.bytes));
    return end_coded_tensor(p, c, scales);
  }
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::Tensor>>> add_tensors(
      std::span<const tensor_source> srcs);

  // Finishes the frame: `body` becomes the message's union member.
  template <class T>
  void finish(flatbuffers::Offset<T> body) {
    finish(wire::BodyTraits<T>::enum_value, body.Union());
  }
  void finish(wire::Body type, flatbuffers::Offset<void> body);
  bool finished() const { return finished_; }

  // The whole frame, length prefix included; valid after finish().
  std::span<const std::byte> frame() const;
  // Hands the frame's memory over (for sending); the builder is empty afterwards.
  flatbuffers::DetachedBuffer release();

 private:
  struct pending_tensor {
    flatbuffers::Offset<flatbuffers::String> name;
    flatbuffers::Offset<flatbuffers::Vector<std::int64_t>> shape;
    flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>> data_vec;
    std::byte* data;
    std::size_t bytes;
  };
  // data_bytes: the payload when it is not shape x dtype (an encoded tensor).
  pending_tensor begin_tensor(core::dtype t, const core::shape& s, std::string_view name,
                              std::size_t data_bytes = SIZE_MAX);
  flatbuffers::Offset<wire::Tensor> end_tensor(const pending_tensor& p, core::dtype t);
  static core::dtype coded_dtype(core::codec c);  // asserts c is f16, bf16 or int8
  flatbuffers::Offset<wire::Tensor> end_coded_tensor(const pending_tensor& p, core::codec c,
                                                     std::span<const float> scales);

  flatbuffers::FlatBufferBuilder fbb_;
  bool finished_ = false;
};

// Frame size to reserve for tensors of these sizes plus `other_bytes` of other fields.
std::size_t estimate_frame_bytes(std::span<const tensor_source> tensors, std::size_t other_bytes = 256);

// ---- The channel's own messages. Every training message has its one builder in protocol/
// (cleave/protocol/protocol.h); the schema is protocol/schema/wire.fbs. ----

// padding: bytes carried only to measure the link's bandwidth (a probe).
message_builder make_ping(std::uint64_t sequence, std::uint64_t sent_ns, std::size_t padding = 0);
message_builder make_pong(std::uint64_t sequence, std::uint64_t sent_ns);
message_builder make_error(wire::ErrorCode code, std::string_view text);

// ---- Receiving ----

// A tensor inside a received message; valid while the message lives.
struct tensor_view {
  core::dtype dtype = core::dtype::f32;
  core::shape shape;
  std::span<const std::byte> data;  // shape.numel() * dtype_size(dtype) bytes, 32-byte aligned
  std::string_view name;
  // An encoded step tensor (see wire::Tensor): data holds the codec's values, shape is decoded.
  core::codec codec = core::codec::f32;
  std::span<const float> scales;             // int8
  std::span<const std::uint32_t> positions;  // topk

  std::int64_t numel() const { return shape.numel(); }
  // The decoded values (f32) into y (numel() values); for codec f32 the tensor must be f32.
  void decode(float* y) const;
  // The elements as T; asserts sizeof(T) == dtype_size(dtype).
  template <class T>
  std::span<const T> values() const {
    CLEAVE_ASSERT(sizeof(T) == core::dtype_size(dtype), "element type does not match the tensor's dtype");
    return {reinterpret_cast<const T*>(data.data()), data.size() / sizeof(T)};
  }
};

// A received frame that passed the Verifier and the semantic checks. Owns its 32-byte aligned
// buffer; accessors read the FlatBuffer in place.
class message {
 public:
  message() = default;

  wire::Body type() const { return root_ ? root_->body_type() : wire::Body::NONE; }
  const wire::Message& root() const {
    CLEAVE_ASSERT(root_ != nullptr);
    return *root_;
  }
  // The body as T, or nullptr when the message is of another type.
  template <class T>
  const T* as() const {
    return root_ ? root_->body_as<T>() : nullptr;
  }
  // Bytes of the whole frame, length prefix included.
  std::size_t frame_bytes() const { return buf_.size(); }
  std::span<const std::byte> frame() const { return {buf_.data(), buf_.size()}; }

 private:
  friend result<message> decode_frame(aligned_bytes frame, const frame_limits& limits);
  aligned_bytes buf_;
  const wire::Message* root_ = nullptr;
};

// Decodes a tensor of a message that passed decode_frame.
tensor_view view_of(const wire::Tensor& t);

std::string_view body_name(wire::Body b);

// Verifies and checks one whole frame (length prefix included) held in 32-byte aligned memory:
// the prefix matches the size, the identifier is "CLV1", the FlatBuffers Verifier (with the
// depth and table limits) passes, then every value is checked (known union member and dtype,
// rank <= 4, dims >= 0, numel * dtype size == data bytes without overflow, ids and counts in range).
result<message> decode_frame(aligned_bytes frame, const frame_limits& limits);

// Why the body of a verified message breaks the semantic rules, or nothing.
std::optional<std::string> check_message(const wire::Message& m, const frame_limits& limits);

// One line describing a message (type and its ids, tensor shapes), for logs.
std::string describe(const message& m);

// Calls fn(name_of_list, tensor) for every tensor of a checked message, in wire order.
void for_each_tensor(const message& m, const std::function<void(std::string_view, const tensor_view&)>& fn);

}  // namespace cleave::transport
