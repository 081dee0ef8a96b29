// Message building, frame verification and the semantic checks on inbound frames.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "cleave/protocol/protocol.h"
#include "cleave/transport/message.h"
#include "frame_bytes.h"
#include "sample_messages.h"

using namespace cleave;
using namespace cleave::transport;
using namespace cleave::protocol;

using cleave::transport::testing::aligned_copy;

namespace {

aligned_bytes finish_raw(flatbuffers::FlatBufferBuilder& f, wire::Body type, flatbuffers::Offset<void> body,
                         const char* identifier = nullptr) {
  const auto m = wire::CreateMessage(f, type, body);
  f.FinishSizePrefixed(m, identifier ? identifier : wire::MessageIdentifier());
  return aligned_copy({reinterpret_cast<const std::byte*>(f.GetBufferPointer()), f.GetSize()});
}

// An Activations frame with a hand-made tensor, bypassing the builder's own checks.
aligned_bytes raw_activation(std::uint8_t dtype, const std::vector<std::int64_t>& shape, std::size_t data_bytes,
                             std::uint32_t micro_batch = 0) {
  flatbuffers::FlatBufferBuilder f;
  const auto s = f.CreateVector(shape);
  const std::vector<std::uint8_t> d(data_bytes, 1);
  const auto dv = f.CreateVector(d);
  const auto t = wire::CreateTensor(f, 0, static_cast<wire::DType>(dtype), s, dv);
  const auto a = wire::CreateActivations(f, 1, 2, micro_batch, 0, 1, t);
  return finish_raw(f, wire::Body::Activations, a.Union());
}

std::string refusal(aligned_bytes frame, const frame_limits& limits = {}) {
  auto r = decode_frame(std::move(frame), limits);
  REQUIRE(!r.ok());
  CHECK(r.error().code() == errc::bad_frame);
  return r.error().reason();
}

}  // namespace

TEST_CASE("every message type survives a round trip through its frame") {
  auto samples = testing::sample_messages();
  CHECK(samples.size() == static_cast<std::size_t>(wire::Body::MAX));
  for (auto& [name, builder] : samples) {
    CAPTURE(name);
    auto decoded = decode_frame(aligned_copy(builder.frame()), {});
    REQUIRE_MESSAGE(decoded.ok(), (decoded.ok() ? std::string() : decoded.error().reason()));
    CHECK(body_name(decoded->type()) == name);
    CHECK(decoded->frame_bytes() == builder.frame().size());
    CHECK(describe(*decoded).rfind(name, 0) == 0);
  }
}

TEST_CASE("activations keep their ids, shapes and bytes, read in place and 32-byte aligned") {
  std::vector<float> act(2 * 3 * 4 * 5);
  for (std::size_t i = 0; i < act.size(); ++i) act[i] = static_cast<float>(i) * 0.5f - 3.f;
  const std::vector<std::int32_t> labels = {4, 1};
  step_key key;
  key.epoch = 9;
  key.step = 77;
  key.micro_batch = 3;
  key.device_id = 12;
  key.block = 5;
  const tensor_source a{core::dtype::f32, {2, 3, 4, 5}, act.data(), "a5"};
  const tensor_source l{core::dtype::i32, {2}, labels.data(), {}};
  auto b = make_activations(key, {2, 1}, a, &l);
  auto decoded = decode_frame(aligned_copy(b.frame()), {});
  REQUIRE(decoded.ok());
  const auto* m = decoded->as<wire::Activations>();
  REQUIRE(m != nullptr);
  CHECK(decoded->as<wire::Gradients>() == nullptr);
  CHECK(m->epoch() == 9);
  CHECK(m->step() == 77);
  CHECK(m->micro_batch() == 3);
  CHECK(m->device_id() == 12);
  CHECK(m->block() == 5);
  const tensor_view v = view_of(*m->activation());
  CHECK(v.dtype == core::dtype::f32);
  CHECK(v.shape == core::shape{2, 3, 4, 5});
  CHECK(v.name == "a5");
  CHECK(reinterpret_cast<std::uintptr_t>(v.data.data()) % 32 == 0);
  const auto values = v.values<float>();
  REQUIRE(values.size() == act.size());
  CHECK(std::memcmp(values.data(), act.data(), act.size() * sizeof(float)) == 0);
  const tensor_view lv = view_of(*m->labels());
  CHECK(lv.dtype == core::dtype::i32);
  CHECK(lv.values<std::int32_t>()[0] == 4);
  CHECK(lv.values<std::int32_t>()[1] == 1);
  CHECK(reinterpret_cast<std::uintptr_t>(lv.data.data()) % 32 == 0);
}

TEST_CASE("tensor payloads sit 32-byte aligned relative to the frame start") {
  std::vector<std::byte> odd(13 * 2);  // f16 (13)
  for (auto& [name, builder] : testing::sample_messages()) {
    CAPTURE(name);
    auto decoded = decode_frame(aligned_copy(builder.frame()), {});
    REQUIRE(decoded.ok());
    int n_tensors = 0;
    for_each_tensor(*decoded, [&](std::string_view, const tensor_view& t) {
      ++n_tensors;
      CHECK(reinterpret_cast<std::uintptr_t>(t.data.data()) % 32 == 0);
    });
    // Frames holding tensors are padded to the tensors' alignment.
    if (n_tensors > 0) CHECK(builder.frame().size() % 32 == 0);
  }
  message_builder b;
  const auto t0 = b.add_tensor(tensor_source{core::dtype::f16, {13}, odd.data(), "x"});
  const auto t1 = b.add_tensor(tensor_source{core::dtype::u8, {3}, odd.data(), {}});
  const auto list = b.fbb().CreateVector(std::vector{t0, t1});
  b.finish(wire::CreateGlobalWeights(b.fbb(), 1, 0, 1, list));
  const auto frame = b.frame();
  const auto* root = flatbuffers::GetSizePrefixedRoot<wire::Message>(frame.data());
  for (const auto* t : *root->body_as<wire::GlobalWeights>()->weights()) {
    const auto offset = reinterpret_cast<const std::byte*>(t->data()->data()) - frame.data();
    CHECK(offset % 32 == 0);
  }
}

TEST_CASE("a fill callback writes tensor bytes straight into the frame") {
  message_builder b(4096);
  std::byte* written_at = nullptr;
  const auto t = b.add_tensor(core::dtype::f32, core::shape{4, 8}, "w", [&](std::span<std::byte> dst) {
    REQUIRE(dst.size() == 4 * 8 * 4);
    written_at = dst.data();
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<std::byte>(i);
  });
  step_key key;
  b.finish(wire::CreateGradients(b.fbb(), key.epoch, key.step, 0, 0, 1, t, 0.f, 0));
  const auto frame = b.frame();
  CHECK(written_at >= frame.data());
  CHECK(written_at < frame.data() + frame.size());
  auto decoded = decode_frame(aligned_copy(frame), {});
  REQUIRE(decoded.ok());
  const auto v = view_of(*decoded->as<wire::Gradients>()->gradient());
  for (std::size_t i = 0; i < v.data.size(); ++i) CHECK(v.data[i] == static_cast<std::byte>(i));
}

TEST_CASE("an empty tensor and a scalar tensor are valid") {
  const float one = 1.f;
  const tensor_source empty{core::dtype::f32, {0, 16}, nullptr, {}};
  const tensor_source scalar{core::dtype::f32, {}, &one, {}};
  const tensor_source both[] = {empty, scalar};
  // Built by hand: the protocol's GlobalWeights carries flat params and buffers only.
  message_builder b;
  const auto list = b.add_tensors(both);
  b.finish(wire::CreateGlobalWeights(b.fbb(), 0, 0, 1, list));
  auto decoded = decode_frame(aligned_copy(b.frame()), {});
  REQUIRE(decoded.ok());
  const auto* w = decoded->as<wire::GlobalWeights>()->weights();
  CHECK(view_of(*w->Get(0)).data.empty());
  CHECK(view_of(*w->Get(1)).shape.rank() == 0);
  CHECK(view_of(*w->Get(1)).values<float>()[0] == 1.f);
}

TEST_CASE("a frame larger than the limit is refused from its header alone") {
  frame_limits limits;
  limits.max_frame_bytes = 1 << 20;
  const auto why = check_frame_length((1u << 20) + 1, limits);
  REQUIRE(why.has_value());
  CHECK(why->find("exceeds the limit of 1048576 bytes") != std::string::npos);
  CHECK(check_frame_length(0xffffffffu, frame_limits{}).has_value());
  CHECK(check_frame_length(4, limits)->find("shorter") != std::string::npos);
  CHECK_FALSE(check_frame_length(1 << 20, limits).has_value());
}

TEST_CASE("a length prefix that disagrees with the frame is refused") {
  auto b = make_ping(1, 2);
  const auto frame = b.frame();
  std::vector<std::byte> longer(frame.begin(), frame.end());
  longer.resize(longer.size() + 32);
  CHECK(refusal(aligned_copy(longer)).find("length prefix says") != std::string::npos);
}

TEST_CASE("a frame with another file identifier is refused") {
  flatbuffers::FlatBufferBuilder f;
  const auto p = wire::CreatePing(f, 1, 2);
  const std::string why = refusal(finish_raw(f, wire::Body::Ping, p.Union(), "XXXX"));
  CHECK(why.find("wrong file identifier 'XXXX'") != std::string::npos);
}

TEST_CASE("a frame with a corrupted offset fails verification") {
  auto b = make_error(wire::ErrorCode::internal, "boom");
  std::vector<std::byte> bytes(b.frame().begin(), b.frame().end());
  // The root offset (after the length prefix) pointing far outside the buffer.
  bytes[4] = std::byte{0xf0};
  bytes[5] = std::byte{0xff};
  bytes[6] = std::byte{0x00};
  bytes[7] = std::byte{0x00};
  CHECK(refusal(aligned_copy(bytes)).find("FlatBuffers verification") != std::string::npos);
}

TEST_CASE("every single-byte corruption of every sample either decodes or is refused cleanly") {
  std::size_t n_refused = 0, n_total = 0;
  for (auto& [name, builder] : testing::sample_messages()) {
    const auto frame = builder.frame();
    std::vector<std::byte> bytes(frame.begin(), frame.end());
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      for (const std::uint8_t flip : {0x01, 0x80, 0xff}) {
        bytes[i] ^= std::byte{flip};
        auto r = decode_frame(aligned_copy(bytes), {});
        if (r.ok()) {
          (void)describe(*r);
        } else {
          CHECK(!r.error().reason().empty());
          ++n_refused;
        }
        ++n_total;
        bytes[i] ^= std::byte{flip};
      }
    }
  }
  CHECK(n_refused > 0);
  CHECK(n_refused < n_total);
}

TEST_CASE("a tensor of unknown dtype is refused") {
  CHECK(refusal(raw_activation(9, {2}, 8)).find("unknown dtype 9") != std::string::npos);
}

TEST_CASE("a tensor whose shape and data size disagree is refused") {
  const std::string why = refusal(raw_activation(0, {2, 3}, 20));
  CHECK(why.find("need 24 bytes, data holds 20") != std::string::npos);
}

TEST_CASE("a tensor shape whose element count overflows is refused") {
  CHECK(refusal(raw_activation(0, {1ll << 40, 1ll << 40}, 8)).find("overflows") != std::string::npos);
  CHECK(refusal(raw_activation(0, {1ll << 62}, 8)).find("byte size overflows") != std::string::npos);
  // An empty tensor whose leading dimensions alone overflow (found by the frame fuzzer).
  CHECK(refusal(raw_activation(0, {3, 4683743612465315842ll, 0}, 0)).find("element count overflows") !=
        std::string::npos);
}

TEST_CASE("a tensor of rank above 4 or with a negative dimension is refused") {
  CHECK(refusal(raw_activation(0, {1, 1, 1, 1, 1}, 4)).find("rank 5") != std::string::npos);
  CHECK(refusal(raw_activation(0, {-2, -3}, 24)).find("negative dimension") != std::string::npos);
}

TEST_CASE("ids out of range are refused") {
  CHECK(refusal(raw_activation(0, {1}, 4, 1u << 20)).find("micro-batch 1048576 out of range") != std::string::npos);
  flatbuffers::FlatBufferBuilder f;
  const auto g = wire::CreateGlobalWeights(f, 1, 5, 5, 0);
  CHECK(refusal(finish_raw(f, wire::Body::GlobalWeights, g.Union())).find("block range [5, 5)") != std::string::npos);
  flatbuffers::FlatBufferBuilder f2;
  const auto st = wire::CreateStageAssignment(f2, 1, wire::Role::edge, 0, 12);
  const auto dp = wire::CreateDevicePlan(f2, 3, f2.CreateVector(std::vector{st}));
  const auto plan = wire::CreatePlan(f2, 1, 10, false, 0, 0, 0, f2.CreateVector(std::vector{dp}));
  CHECK(refusal(finish_raw(f2, wire::Body::Plan, plan.Union())).find("beyond 10") != std::string::npos);
}

TEST_CASE("a message of unknown type is refused") {
  flatbuffers::FlatBufferBuilder f;
  const auto p = wire::CreatePing(f, 1, 2);
  CHECK(refusal(finish_raw(f, static_cast<wire::Body>(200), p.Union())).find("unknown message type 200") !=
        std::string::npos);
}

TEST_CASE("labels whose batch differs from the activation's are refused") {
  const std::vector<float> a(4 * 3);
  const std::vector<std::int32_t> l(5);
  const tensor_source at{core::dtype::f32, {4, 3}, a.data(), {}};
  const tensor_source lt{core::dtype::i32, {5}, l.data(), {}};
  auto b = make_activations(step_key{}, {4, 1}, at, &lt);
  CHECK(refusal(aligned_copy(b.frame())).find("batch size") != std::string::npos);
}

TEST_CASE("the depth, table, tensor and string limits apply") {
  auto samples = testing::sample_messages();
  const auto frame_of = [&](const std::string& name) {
    for (auto& [n, b] : samples)
      if (n == name) return aligned_copy(b.frame());
    FAIL("no sample " << name);
    return aligned_bytes{};
  };
  frame_limits shallow;
  shallow.max_depth = 2;
  CHECK(refusal(frame_of("Plan"), shallow).find("verification") != std::string::npos);
  frame_limits few_tables;
  few_tables.max_tables = 3;
  CHECK(refusal(frame_of("Plan"), few_tables).find("verification") != std::string::npos);
  frame_limits one_tensor;
  one_tensor.max_tensors = 1;
  CHECK(refusal(frame_of("ReplicaUpload"), one_tensor).find("entries exceed the limit") != std::string::npos);
  frame_limits short_strings;
  short_strings.max_string_bytes = 4;
  CHECK(refusal(frame_of("Error"), short_strings).find("error text of 28 bytes") != std::string::npos);
}

TEST_CASE("non-finite profile measurements are refused") {
  split::node_profile p;
  p.blocks.push_back({-1e-6, 2e-6, 0, 0, 0, 0});
  auto b = make_profile(p, 0, 0);
  CHECK(refusal(aligned_copy(b.frame())).find("forward time is negative") != std::string::npos);
}

TEST_CASE("tensor data or shapes that are not aligned for in-place reads are refused") {
  {
    flatbuffers::FlatBufferBuilder f;
    const auto s = f.CreateVector(std::vector<std::int64_t>{2});
    f.ForceVectorAlignment(12, 1, 32);  // leaves the 8 data bytes 4 bytes off a 32-byte boundary
    const auto d = f.CreateVector(std::vector<std::uint8_t>(8, 1));
    const auto t = wire::CreateTensor(f, 0, wire::DType::f32, s, d);
    const auto a = wire::CreateActivations(f, 1, 2, 0, 0, 1, t);
    aligned_bytes frame = finish_raw(f, wire::Body::Activations, a.Union());
    const auto* root = flatbuffers::GetSizePrefixedRoot<wire::Message>(frame.data());
    const auto* data = root->body_as<wire::Activations>()->activation()->data()->data();
    REQUIRE(reinterpret_cast<std::uintptr_t>(data) % 32 != 0);
    CHECK(refusal(std::move(frame)).find("data is not 32-byte aligned") != std::string::npos);
  }
  {
    flatbuffers::FlatBufferBuilder f;
    const auto name = f.CreateString(std::string(32, 'x'));  // bytes the misread vector runs into
    f.ForceVectorAlignment(12, 1, 8);
    std::uint8_t* raw = nullptr;
    // Two 4-byte elements read back as one int64 dimension 4 bytes off its alignment.
    const auto s = flatbuffers::Offset<flatbuffers::Vector<std::int64_t>>(f.CreateUninitializedVector(2, 4, &raw));
    std::memset(raw, 0, 8);
    raw[0] = 1;
    const auto t = wire::CreateTensor(f, name, wire::DType::u8, s, 0);
    const auto a = wire::CreateActivations(f, 1, 2, 0, 0, 1, t);
    aligned_bytes frame = finish_raw(f, wire::Body::Activations, a.Union());
    const auto* root = flatbuffers::GetSizePrefixedRoot<wire::Message>(frame.data());
    REQUIRE(reinterpret_cast<std::uintptr_t>(root->body_as<wire::Activations>()->activation()->shape()->data()) % 8 !=
            0);
    const std::string why = refusal(std::move(frame));
    CAPTURE(why);
    CHECK(why.find("misaligned shape") != std::string::npos);
  }
}

TEST_CASE("a round start with a negative or non-finite learning rate is refused") {
  for (const float lr : {-0.1f, std::numeric_limits<float>::quiet_NaN()}) {
    round_start_desc r;
    r.round = 1;
    r.local_steps = 5;
    r.learning_rate = lr;
    auto b = make_round_start(r);
    CHECK(refusal(aligned_copy(b.frame())).find("learning rate is not a finite number >= 0") != std::string::npos);
  }
}

namespace {

// A step frame whose tensor carries a codec, bypassing the builder's own checks.
struct coded_tensor {
  wire::Codec codec = wire::Codec::none;
  std::uint8_t dtype = 0;
  std::vector<std::int64_t> shape{2, 3};
  std::size_t data_bytes = 24;
  std::optional<std::vector<float>> scales;
  std::optional<std::vector<std::uint32_t>> positions;
  bool gradient = false;
};

aligned_bytes raw_coded(const coded_tensor& c) {
  flatbuffers::FlatBufferBuilder f;
  const auto s = f.CreateVector(c.shape);
  const std::vector<std::uint8_t> d(c.data_bytes, 1);
  f.ForceVectorAlignment(d.size(), 1, 32);  // where the builder puts tensor data
  const auto dv = f.CreateVector(d);
  const auto sc = c.scales ? f.CreateVector(*c.scales) : 0;
  const auto pos = c.positions ? f.CreateVector(*c.positions) : 0;
  const auto t = wire::CreateTensor(f, 0, static_cast<wire::DType>(c.dtype), s, dv, c.codec, sc, pos);
  if (c.gradient) return finish_raw(f, wire::Body::Gradients, wire::CreateGradients(f, 1, 2, 0, 0, 1, t).Union());
  return finish_raw(f, wire::Body::Activations, wire::CreateActivations(f, 1, 2, 0, 0, 1, t).Union());
}

}  // namespace

TEST_CASE("encoded activations and gradients decode within their codec's error bound") {
  const auto x = testing::encoded_sample_values();
  const auto plain = make_activations({}, {3, 1}, tensor_source{core::dtype::f32, {3, 2, 5, 5}, x.data(), "a"});
  for (auto& [name, builder] : testing::encoded_step_messages()) {
    CAPTURE(name);
    auto decoded = decode_frame(aligned_copy(builder.frame()), {});
    REQUIRE_MESSAGE(decoded.ok(), (decoded.ok() ? std::string() : decoded.error().reason()));
    const auto* a = decoded->as<wire::Activations>();
    const auto* g = decoded->as<wire::Gradients>();
    const tensor_view v = view_of(a ? *a->activation() : *g->gradient());
    CHECK(v.shape == core::shape{3, 2, 5, 5});
    CHECK(builder.frame().size() < plain.frame().size());
    std::vector<float> y(x.size());
    v.decode(y.data());
    if (v.codec == core::codec::topk) {
      // The 15 largest magnitudes, exact; every other value 0.
      std::vector<float> mag(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) mag[i] = std::fabs(x[i]);
      std::sort(mag.begin(), mag.end(), std::greater<>());
      REQUIRE(v.positions.size() == 15);
      for (std::size_t i = 0; i < x.size(); ++i) {
        if (y[i] != 0.0f) CHECK(y[i] == x[i]);
        if (std::fabs(x[i]) > mag[15]) CHECK(y[i] == x[i]);
      }
      continue;
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float err = std::fabs(y[i] - x[i]);
      if (v.codec == core::codec::f16) CHECK(err <= std::max(std::fabs(x[i]) * 0x1p-11f, 0x1p-25f));
      if (v.codec == core::codec::bf16) CHECK(err <= std::fabs(x[i]) * 0x1p-8f);
      if (v.codec == core::codec::int8) CHECK(err <= 0.5f * v.scales[(i / 25) % 2] * 1.0001f);
    }
  }
}

TEST_CASE("encoded tensors that break their codec's rules are refused, naming the rule") {
  coded_tensor c;
  c.codec = wire::Codec::topk;
  c.dtype = 0;
  c.positions = std::vector<std::uint32_t>{1, 4};
  c.data_bytes = 8;
  CHECK(refusal(raw_coded(c)).find("topk is for gradients only") != std::string::npos);
  c.gradient = true;
  CHECK(decode_frame(raw_coded(c), {}).ok());
  c.positions = std::vector<std::uint32_t>{4, 1};
  CHECK(refusal(raw_coded(c)).find("not increasing") != std::string::npos);
  c.positions = std::vector<std::uint32_t>{1, 6};
  CHECK(refusal(raw_coded(c)).find("out of range") != std::string::npos);
  c.positions.reset();
  CHECK(refusal(raw_coded(c)).find("positions missing for topk") != std::string::npos);
  // Two values may not claim a tensor that decodes beyond what any frame could carry.
  c.positions = std::vector<std::uint32_t>{1, 4};
  c.shape = {1ll << 20, 1ll << 20};
  CHECK(refusal(raw_coded(c)).find("would decode to more than the frame limit") != std::string::npos);

  coded_tensor q;
  q.codec = wire::Codec::int8;
  q.dtype = 3;  // i8
  q.data_bytes = 6;
  q.scales = std::vector<float>{0.5f, 0.25f, 1.0f};
  CHECK(decode_frame(raw_coded(q), {}).ok());
  q.scales = std::vector<float>{0.5f, 0.25f};
  CHECK(refusal(raw_coded(q)).find("2 int8 scales for 3 channels") != std::string::npos);
  q.scales = std::vector<float>{0.5f, -1.0f, 1.0f};
  CHECK(refusal(raw_coded(q)).find("int8 scale") != std::string::npos);
  q.scales = std::vector<float>{0.5f, std::numeric_limits<float>::infinity(), 1.0f};
  CHECK(refusal(raw_coded(q)).find("int8 scale") != std::string::npos);
  q.scales.reset();
  CHECK(refusal(raw_coded(q)).find("scales missing for int8") != std::string::npos);
  q.scales = std::vector<float>{0.5f, 0.25f, 1.0f};
  q.dtype = 0;
  q.data_bytes = 24;
  CHECK(refusal(raw_coded(q)).find("codec int8 with dtype f32") != std::string::npos);

  coded_tensor h;
  h.dtype = 1;  // f16 bytes without saying so
  h.data_bytes = 12;
  CHECK(refusal(raw_coded(h)).find("dtype f16 without a codec") != std::string::npos);
  h.codec = wire::Codec::f16;
  CHECK(decode_frame(raw_coded(h), {}).ok());
  h.codec = static_cast<wire::Codec>(9);
  CHECK(refusal(raw_coded(h)).find("unknown codec 9") != std::string::npos);
}

TEST_CASE("a plan's hop codecs are checked: pairs, known codecs, no topk for activations") {
  plan_desc p;
  p.epoch = 2;
  p.model_json = R"({"input": [4], "classes": 2, "blocks": [{"type": "linear", "out_features": 2}]})";
  p.micro_batch_size = 8;
  p.n_micro_batches = 1;
  p.device_id = 5;
  p.route = split::make_route(false, false, {1}, 1);
  p.hops = {{core::codec::int8, core::codec::topk}};
  p.topk_fraction = 0.05f;
  auto decoded = decode_frame(aligned_copy(make_plan(p).frame()), {});
  REQUIRE(decoded.ok());
  const auto cut = cut_settings_for(*decoded->as<wire::Plan>(), 5, p.route);
  REQUIRE(cut.hops.size() == 1);
  CHECK(cut.hops[0] == p.hops[0]);
  CHECK(cut.topk_fraction == doctest::Approx(0.05f));
  CHECK(cut.spec(0, true, 0).id == core::codec::int8);
  CHECK(cut.spec(0, false, 0).id == core::codec::topk);
  // Another device's plan: f32 on every hop.
  CHECK(cut_settings_for(*decoded->as<wire::Plan>(), 6, p.route).hops[0] == core::hop_codecs{});
  p.hops = {{core::codec::topk, core::codec::f32}};
  CHECK(refusal(aligned_copy(make_plan(p).frame())).find("topk for activations") != std::string::npos);
}

TEST_CASE("secure aggregation messages with malformed keys, blobs or block bounds are refused") {
  const auto frame = [](auto build) {
    flatbuffers::FlatBufferBuilder f;
    const auto body = build(f);
    return finish_raw(f, wire::Body::SecAgg, body.Union());
  };
  const std::vector<std::uint8_t> k31(31, 1), k32(32, 1), big(5000, 1);
  SUBCASE("a public key that is not 32 bytes") {
    const auto why = refusal(frame([&](flatbuffers::FlatBufferBuilder& f) {
      const auto key = wire::CreateSecAggKey(f, 3, f.CreateVector(k31), f.CreateVector(k32));
      return wire::CreateSecAgg(f, wire::SecAggPhase::keys, 1, 3, f.CreateVector(&key, 1));
    }));
    CHECK(why.find("public keys must be 32 bytes") != std::string::npos);
  }
  SUBCASE("a blob beyond the size of a sealed share") {
    const auto why = refusal(frame([&](flatbuffers::FlatBufferBuilder& f) {
      const auto blob = wire::CreateSecAggBlob(f, 4, f.CreateVector(big));
      return wire::CreateSecAgg(f, wire::SecAggPhase::shares, 1, 3, 0, 0, f.CreateVector(&blob, 1));
    }));
    CHECK(why.find("exceeds 4096 bytes") != std::string::npos);
  }
  SUBCASE("an odd number of block bounds") {
    const std::vector<std::uint32_t> bounds{0, 4, 6};
    const auto why = refusal(frame([&](flatbuffers::FlatBufferBuilder& f) {
      return wire::CreateSecAgg(f, wire::SecAggPhase::mask_set, 1, 3, 0, 0, 0, 0, 0, f.CreateVector(bounds));
    }));
    CHECK(why.find("odd number of block bounds") != std::string::npos);
  }
  SUBCASE("an unknown phase") {
    const auto why = refusal(frame([&](flatbuffers::FlatBufferBuilder& f) {
      return wire::CreateSecAgg(f, static_cast<wire::SecAggPhase>(42), 1, 3);
    }));
    CHECK(why.find("unknown secure aggregation phase") != std::string::npos);
  }
}
