// Messages: builders that write each message type (tensor bytes straight into the builder's
// buffer), and the verified, decoded view of a received frame.
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
#include "cleave/core/tier.h"
#include "cleave/transport/frame.h"
#include "cleave/transport/result.h"
#include "cleave/transport/wire_generated.h"

namespace cleave::transport {

inline constexpr std::uint16_t protocol_version = static_cast<std::uint16_t>(wire::ProtocolVersion::v1);

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

// ---- One builder per message type. Fields are those of transport/schema/wire.fbs. ----

struct backend_desc {
  std::string_view name;
  float gflops = 0;
  std::uint64_t memory_bytes = 0;
};

struct hello_info {
  core::tier role = core::tier::device;
  std::uint32_t node_id = 0;
  std::string_view name;
  std::span<const backend_desc> backends;
  std::uint64_t memory_bytes = 0;
  float gflops = 0;
  std::uint64_t n_samples = 0;
  std::uint16_t version = protocol_version;
};
message_builder make_hello(const hello_info& info);

struct welcome_info {
  std::uint32_t node_id = 0;
  std::uint64_t run_id = 0;
  std::uint32_t plan_epoch = 0;
  std::uint32_t heartbeat_ms = 0;
  std::uint16_t version = protocol_version;
  bool per_device_replicas = false;  // to an edge: forward each device's replicas, no pre-average
};
message_builder make_welcome(const welcome_info& info);

struct stage_desc {
  std::uint32_t node_id = 0;
  core::tier role = core::tier::server;
  std::uint32_t first_block = 0;
  std::uint32_t end_block = 0;
  bool with_loss = false;
};
struct device_plan_desc {
  std::uint32_t device_id = 0;
  std::span<const stage_desc> stages;
};
struct plan_info {
  std::uint32_t epoch = 0;
  std::uint32_t n_blocks = 0;
  bool u_shape = false;
  std::string_view model;
  std::uint32_t micro_batch_size = 0;
  std::uint32_t n_micro_batches = 0;
  std::span<const device_plan_desc> devices;
};
message_builder make_plan(const plan_info& info);

// Identifies one micro-batch crossing one cut: `block` is the first block after the cut.
struct step_key {
  std::uint32_t epoch = 0;
  std::uint64_t step = 0;
  std::uint32_t micro_batch = 0;
  std::uint32_t device_id = 0;
  std::uint32_t block = 0;
  std::uint32_t attempt = 1;  // at the step's round (see wire::RoundStart)
};
// activation (B, ...) going up; labels (B) or (B, K) when the loss is computed above.
message_builder make_activations(const step_key& key, const tensor_source& activation,
                                 const tensor_source* labels = nullptr);
// gradient: same shape as the activation it answers.
message_builder make_gradients(const step_key& key, const tensor_source& gradient, float loss = 0,
                               std::uint32_t n_correct = 0);

struct round_start_info {
  std::uint64_t round = 0;
  std::uint32_t epoch = 0;
  std::uint32_t local_steps = 0;
  std::uint64_t deadline_ms = 0;
  float learning_rate = 0;
};
message_builder make_round_start(const round_start_info& info);

struct replica_info {
  std::uint64_t round = 0;
  std::uint32_t node_id = 0;
  std::uint32_t first_block = 0;
  std::uint32_t end_block = 0;
  std::uint64_t n_samples = 0;
};
message_builder make_replica_upload(const replica_info& info, std::span<const tensor_source> weights);

struct global_weights_info {
  std::uint64_t round = 0;
  std::uint32_t first_block = 0;
  std::uint32_t end_block = 0;
};
message_builder make_global_weights(const global_weights_info& info, std::span<const tensor_source> weights);

struct block_profile_desc {
  std::uint32_t block = 0;
  float forward_us = 0;
  float backward_us = 0;
  std::uint64_t memory_bytes = 0;  // parameters and buffers
  std::uint64_t output_bytes = 0;  // per sample
  std::uint64_t state_bytes = 0;   // optimizer state
  std::uint64_t saved_bytes = 0;   // kept for backward, per sample
};
struct link_profile_desc {
  std::uint32_t peer_id = 0;
  float rtt_us = 0;
  float bandwidth_bytes_per_s = 0;
};
struct profile_info {
  std::uint32_t node_id = 0;
  std::uint32_t epoch = 0;
  std::uint64_t step = 0;
  std::uint64_t memory_budget_bytes = 0;
  std::span<const block_profile_desc> blocks;
  std::span<const link_profile_desc> links;
  std::uint32_t batch = 0;  // samples per timed micro-batch
  std::string_view backend;
};
message_builder make_profile(const profile_info& info);

struct migrate_info {
  std::uint32_t epoch = 0;
  std::uint64_t step = 0;
  std::uint32_t first_block = 0;
  std::uint32_t end_block = 0;
  std::uint32_t from_node = 0;
  std::uint32_t to_node = 0;
  std::uint32_t device_id = 0;
  core::tier from_role = core::tier::device;
  core::tier to_role = core::tier::server;
  std::uint64_t optimizer_steps = 0;
};
message_builder make_migrate(const migrate_info& info, std::span<const tensor_source> weights,
                             std::span<const tensor_source> optimizer_state);

message_builder make_cutover(std::uint32_t device_id, std::uint32_t epoch, std::uint64_t step);

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

// The key of a step message (Activations or Gradients); nothing for any other message.
std::optional<step_key> step_key_of(const message& m);

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
