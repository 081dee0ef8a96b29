// The message builder (tensor bytes go straight into the FlatBuffers buffer) and the channel's own
// messages: Ping, Pong and Error.
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

}  // namespace cleave::transport
