// Builders of every message type; tensor bytes go straight into the FlatBuffers buffer.
#include "cleave/transport/message.h"

#include "buffer_pool.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

namespace cleave::transport {

static_assert(static_cast<int>(wire::DType::f32) == static_cast<int>(core::dtype::f32));
static_assert(static_cast<int>(wire::DType::f16) == static_cast<int>(core::dtype::f16));
static_assert(static_cast<int>(wire::DType::bf16) == static_cast<int>(core::dtype::bf16));
static_assert(static_cast<int>(wire::DType::i8) == static_cast<int>(core::dtype::i8));
static_assert(static_cast<int>(wire::DType::u8) == static_cast<int>(core::dtype::u8));
static_assert(static_cast<int>(wire::DType::i32) == static_cast<int>(core::dtype::i32));
static_assert(static_cast<int>(wire::DType::MAX) + 1 == core::n_dtypes);
static_assert(static_cast<int>(wire::Role::server) == static_cast<int>(core::tier::server));
static_assert(static_cast<int>(wire::Role::edge) == static_cast<int>(core::tier::edge));
static_assert(static_cast<int>(wire::Role::device) == static_cast<int>(core::tier::device));

namespace {

// Bytes of a tensor a caller hands us; bad shapes here are programmer errors.
std::size_t tensor_bytes(core::dtype t, const core::shape& s) {
  CLEAVE_ASSERT(s.rank() >= 0 && s.rank() <= core::shape::max_rank);
  std::size_t n = 1;
  for (int i = 0; i < s.rank(); ++i) {
    CLEAVE_ASSERT(s[i] >= 0, "negative dimension in shape " + s.str());
    CLEAVE_ASSERT(!__builtin_mul_overflow(n, static_cast<std::size_t>(s[i]), &n), "shape too large");
  }
  std::size_t bytes = 0;
  CLEAVE_ASSERT(!__builtin_mul_overflow(n, core::dtype_size(t), &bytes), "shape too large");
  return bytes;
}

wire::Role to_wire(core::tier r) {
  return static_cast<wire::Role>(r);
}

}  // namespace

namespace {

// Builder memory from the buffer pool; one stateless instance serves every builder.
class pooled_allocator final : public flatbuffers::Allocator {
 public:
  std::uint8_t* allocate(std::size_t size) override {
    std::size_t capacity = 0;
    void* p = detail::pool_take(size, capacity);
    if (!p) throw std::bad_alloc();
    return static_cast<std::uint8_t*>(p);
  }
  void deallocate(std::uint8_t* p, std::size_t size) override { detail::pool_give(p, detail::pool_capacity(size)); }
};

pooled_allocator the_allocator;

}  // namespace

message_builder::message_builder(std::size_t initial_bytes)
    : fbb_(initial_bytes < 64 ? 64 : initial_bytes, &the_allocator, false, frame_alignment) {}

message_builder::pending_tensor message_builder::begin_tensor(core::dtype t, const core::shape& s,
                                                              std::string_view name, std::size_t data_bytes) {
  CLEAVE_ASSERT(!finished_, "message already finished");
  pending_tensor p{};
  p.bytes = data_bytes == SIZE_MAX ? tensor_bytes(t, s) : data_bytes;
  if (!name.empty()) p.name = fbb_.CreateString(name.data(), name.size());
  std::int64_t dims[core::shape::max_rank] = {};
  for (int i = 0; i < s.rank(); ++i) dims[i] = s[i];
  p.shape = fbb_.CreateVector(dims, static_cast<std::size_t>(s.rank()));
  fbb_.ForceVectorAlignment(p.bytes, 1, frame_alignment);
  std::uint8_t* dst = nullptr;
  p.data_vec = flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>>(fbb_.CreateUninitializedVector(p.bytes, 1, &dst));
  p.data = reinterpret_cast<std::byte*>(dst);
  return p;
}

flatbuffers::Offset<wire::Tensor> message_builder::end_tensor(const pending_tensor& p, core::dtype t) {
  return wire::CreateTensor(fbb_, p.name, static_cast<wire::DType>(t), p.shape, p.data_vec);
}

core::dtype message_builder::coded_dtype(core::codec c) {
  switch (c) {
    case core::codec::f16:
      return core::dtype::f16;
    case core::codec::bf16:
      return core::dtype::bf16;
    case core::codec::int8:
      return core::dtype::i8;
    default:
      CLEAVE_ASSERT(false, "a coded tensor is f16, bf16 or int8");
      return core::dtype::f32;
  }
}

flatbuffers::Offset<wire::Tensor> message_builder::end_coded_tensor(const pending_tensor& p, core::codec c,
                                                                    std::span<const float> scales) {
  if (c != core::codec::int8)
    return wire::CreateTensor(fbb_, p.name, static_cast<wire::DType>(coded_dtype(c)), p.shape, p.data_vec,
                              static_cast<wire::Codec>(c));
  const auto sc = fbb_.CreateVector(scales.data(), scales.size());
  return wire::CreateTensor(fbb_, p.name, wire::DType::i8, p.shape, p.data_vec, wire::Codec::int8, sc);
}

flatbuffers::Offset<wire::Tensor> message_builder::add_tensor(const tensor_source& src) {
  return add_tensor(src.dtype, src.shape, src.name, [&](std::span<std::byte> dst) {
    if (dst.empty()) return;
    CLEAVE_ASSERT(src.data != nullptr, "tensor_source without data");
    std::memcpy(dst.data(), src.data, dst.size());
  });
}

flatbuffers::Offset<wire::Tensor> message_builder::add_encoded_tensor(const core::codec_spec& spec,
                                                                      const core::shape& s, std::string_view name,
                                                                      const float* values, float* residual) {
  const std::int64_t n = s.numel();
  std::int64_t dims[core::shape::max_rank] = {};
  for (int i = 0; i < s.rank(); ++i) dims[i] = s[i];
  core::dtype dt = core::dtype::f32;
  switch (spec.id) {
    case core::codec::f32:
      return add_tensor({core::dtype::f32, s, values, name});
    case core::codec::f16:
    case core::codec::bf16:
      dt = spec.id == core::codec::f16 ? core::dtype::f16 : core::dtype::bf16;
      break;
    case core::codec::int8: {
      // Encoded straight into the frame; the scales follow (data already written stays put).
      const auto l = core::channel_layout_of(dims, s.rank());
      std::vector<float> sc(static_cast<std::size_t>(l.channels));
      const pending_tensor p = begin_tensor(core::dtype::i8, s, name);
      core::encode_int8(values, l, reinterpret_cast<std::int8_t*>(p.data), sc.data(), spec.stochastic, spec.seed);
      const auto scales = fbb_.CreateVector(sc);
      return wire::CreateTensor(fbb_, p.name, wire::DType::i8, p.shape, p.data_vec, wire::Codec::int8, scales);
    }
    case core::codec::topk: {
      const std::int64_t k = core::topk_count(n, spec.topk_fraction);
      std::vector<std::uint32_t> pos(static_cast<std::size_t>(k));
      const pending_tensor p = begin_tensor(core::dtype::f32, s, name, static_cast<std::size_t>(k) * sizeof(float));
      core::encode_topk(values, n, k, residual, reinterpret_cast<float*>(p.data), pos.data());
      const auto positions = fbb_.CreateVector(pos);
      return wire::CreateTensor(fbb_, p.name, wire::DType::f32, p.shape, p.data_vec, wire::Codec::topk, 0, positions);
    }
  }
  const pending_tensor p = begin_tensor(dt, s, name);
  auto* out = reinterpret_cast<std::uint16_t*>(p.data);
  if (spec.id == core::codec::f16)
    core::encode_f16(values, out, n);
  else
    core::encode_bf16(values, out, n);
  return wire::CreateTensor(fbb_, p.name, static_cast<wire::DType>(dt), p.shape, p.data_vec,
                            static_cast<wire::Codec>(spec.id));
}

flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::Tensor>>> message_builder::add_tensors(
    std::span<const tensor_source> srcs) {
  std::vector<flatbuffers::Offset<wire::Tensor>> offsets;
  offsets.reserve(srcs.size());
  for (const auto& s : srcs) offsets.push_back(add_tensor(s));
  return fbb_.CreateVector(offsets);
}

void message_builder::finish(wire::Body type, flatbuffers::Offset<void> body) {
  CLEAVE_ASSERT(!finished_, "message already finished");
  const auto root = wire::CreateMessage(fbb_, type, body);
  fbb_.FinishSizePrefixed(root, wire::MessageIdentifier());
  finished_ = true;
}

message_builder message_builder::from_frame(std::span<const std::byte> frame) {
  message_builder b(frame.size());
  b.fbb_.PushBytes(reinterpret_cast<const std::uint8_t*>(frame.data()), frame.size());
  b.finished_ = true;
  return b;
}

std::span<const std::byte> message_builder::frame() const {
  CLEAVE_ASSERT(finished_, "message not finished");
  return {reinterpret_cast<const std::byte*>(fbb_.GetBufferPointer()), fbb_.GetSize()};
}

flatbuffers::DetachedBuffer message_builder::release() {
  CLEAVE_ASSERT(finished_, "message not finished");
  finished_ = false;
  return fbb_.Release();
}

std::size_t estimate_frame_bytes(std::span<const tensor_source> tensors, std::size_t other_bytes) {
  std::size_t n = other_bytes + 64;
  for (const auto& t : tensors) n += tensor_bytes(t.dtype, t.shape) + t.name.size() + 96 + frame_alignment;
  return n;
}

message_builder make_hello(const hello_info& info) {
  message_builder b(256 + info.name.size() + info.backends.size() * 64);
  auto& f = b.fbb();
  const auto name = f.CreateString(info.name.data(), info.name.size());
  std::vector<flatbuffers::Offset<wire::BackendInfo>> backends;
  for (const auto& d : info.backends)
    backends.push_back(
        wire::CreateBackendInfo(f, f.CreateString(d.name.data(), d.name.size()), d.gflops, d.memory_bytes));
  const auto list = f.CreateVector(backends);
  b.finish(wire::CreateHello(f, info.version, to_wire(info.role), info.node_id, name, list, info.memory_bytes,
                             info.gflops, info.n_samples));
  return b;
}

message_builder make_welcome(const welcome_info& info) {
  message_builder b(128);
  b.finish(wire::CreateWelcome(b.fbb(), info.version, info.node_id, info.run_id, info.plan_epoch, info.heartbeat_ms,
                               info.per_device_replicas));
  return b;
}

message_builder make_plan(const plan_info& info) {
  std::size_t n_stages = 0;
  for (const auto& d : info.devices) n_stages += d.stages.size();
  message_builder b(256 + info.model.size() + info.devices.size() * 48 + n_stages * 48);
  auto& f = b.fbb();
  const auto model = f.CreateString(info.model.data(), info.model.size());
  std::vector<flatbuffers::Offset<wire::DevicePlan>> devices;
  for (const auto& d : info.devices) {
    std::vector<flatbuffers::Offset<wire::StageAssignment>> stages;
    for (const auto& s : d.stages)
      stages.push_back(
          wire::CreateStageAssignment(f, s.node_id, to_wire(s.role), s.first_block, s.end_block, s.with_loss));
    devices.push_back(wire::CreateDevicePlan(f, d.device_id, f.CreateVector(stages)));
  }
  const auto list = f.CreateVector(devices);
  b.finish(wire::CreatePlan(f, info.epoch, info.n_blocks, info.u_shape, model, info.micro_batch_size,
                            info.n_micro_batches, list));
  return b;
}

message_builder make_activations(const step_key& key, const tensor_source& activation, const tensor_source* labels) {
  const tensor_source both[2] = {activation, labels ? *labels : tensor_source{}};
  message_builder b(estimate_frame_bytes(std::span(both, labels ? 2 : 1)));
  const auto a = b.add_tensor(activation);
  flatbuffers::Offset<wire::Tensor> l;
  if (labels) l = b.add_tensor(*labels);
  b.finish(wire::CreateActivations(b.fbb(), key.epoch, key.step, key.micro_batch, key.device_id, key.block, a, l, 0, 0,
                                   key.attempt));
  return b;
}

message_builder make_gradients(const step_key& key, const tensor_source& gradient, float loss,
                               std::uint32_t n_correct) {
  message_builder b(estimate_frame_bytes(std::span(&gradient, 1)));
  const auto g = b.add_tensor(gradient);
  b.finish(wire::CreateGradients(b.fbb(), key.epoch, key.step, key.micro_batch, key.device_id, key.block, g, loss,
                                 n_correct, key.attempt));
  return b;
}

message_builder make_round_start(const round_start_info& info) {
  message_builder b(128);
  b.finish(
      wire::CreateRoundStart(b.fbb(), info.round, info.epoch, info.local_steps, info.deadline_ms, info.learning_rate));
  return b;
}

message_builder make_replica_upload(const replica_info& info, std::span<const tensor_source> weights) {
  message_builder b(estimate_frame_bytes(weights));
  const auto w = b.add_tensors(weights);
  b.finish(wire::CreateReplicaUpload(b.fbb(), info.round, info.node_id, info.first_block, info.end_block,
                                     info.n_samples, w));
  return b;
}

message_builder make_global_weights(const global_weights_info& info, std::span<const tensor_source> weights) {
  message_builder b(estimate_frame_bytes(weights));
  const auto w = b.add_tensors(weights);
  b.finish(wire::CreateGlobalWeights(b.fbb(), info.round, info.first_block, info.end_block, w));
  return b;
}

message_builder make_profile(const profile_info& info) {
  message_builder b(256 + info.blocks.size() * 64 + info.links.size() * 48);
  auto& f = b.fbb();
  std::vector<flatbuffers::Offset<wire::BlockProfile>> blocks;
  for (const auto& p : info.blocks)
    blocks.push_back(wire::CreateBlockProfile(f, p.block, p.forward_us, p.backward_us, p.memory_bytes, p.output_bytes,
                                              p.state_bytes, p.saved_bytes));
  const auto bl = f.CreateVector(blocks);
  std::vector<flatbuffers::Offset<wire::LinkProfile>> links;
  for (const auto& l : info.links)
    links.push_back(wire::CreateLinkProfile(f, l.peer_id, l.rtt_us, l.bandwidth_bytes_per_s));
  const auto ll = f.CreateVector(links);
  const auto be = f.CreateString(info.backend.data(), info.backend.size());
  b.finish(
      wire::CreateProfile(f, info.node_id, info.epoch, info.step, info.memory_budget_bytes, bl, ll, info.batch, be));
  return b;
}

message_builder make_migrate(const migrate_info& info, std::span<const tensor_source> weights,
                             std::span<const tensor_source> optimizer_state) {
  message_builder b(estimate_frame_bytes(weights) + estimate_frame_bytes(optimizer_state));
  const auto w = b.add_tensors(weights);
  const auto o = b.add_tensors(optimizer_state);
  b.finish(wire::CreateMigrate(b.fbb(), info.epoch, info.step, info.first_block, info.end_block, info.from_node,
                               info.to_node, w, o, info.device_id, static_cast<wire::Role>(info.from_role),
                               static_cast<wire::Role>(info.to_role), info.optimizer_steps));
  return b;
}

message_builder make_cutover(std::uint32_t device_id, std::uint32_t epoch, std::uint64_t step) {
  message_builder b(96);
  b.finish(wire::CreateCutover(b.fbb(), device_id, epoch, step));
  return b;
}

message_builder make_ping(std::uint64_t sequence, std::uint64_t sent_ns, std::size_t padding) {
  message_builder b(96 + padding);
  flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>> pad;
  if (padding > 0) {
    std::uint8_t* data = nullptr;
    pad = b.fbb().CreateUninitializedVector(padding, &data);
    std::memset(data, 0, padding);
  }
  b.finish(wire::CreatePing(b.fbb(), sequence, sent_ns, pad));
  return b;
}

message_builder make_pong(std::uint64_t sequence, std::uint64_t sent_ns) {
  message_builder b(96);
  b.finish(wire::CreatePong(b.fbb(), sequence, sent_ns));
  return b;
}

message_builder make_error(wire::ErrorCode code, std::string_view text) {
  message_builder b(96 + text.size());
  const auto s = b.fbb().CreateString(text.data(), text.size());
  b.finish(wire::CreateError(b.fbb(), code, s));
  return b;
}

std::optional<step_key> step_key_of(const message& m) {
  if (const auto* a = m.as<wire::Activations>())
    return step_key{a->epoch(), a->step(), a->micro_batch(), a->device_id(), a->block(), a->attempt()};
  if (const auto* g = m.as<wire::Gradients>())
    return step_key{g->epoch(), g->step(), g->micro_batch(), g->device_id(), g->block(), g->attempt()};
  return std::nullopt;
}

}  // namespace cleave::transport
