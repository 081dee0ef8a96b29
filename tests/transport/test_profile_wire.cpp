// Node profiles in Profile messages: per-block times and sizes survive the trip, and a profile
// that does not fit the model is refused with the reason.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "../support/error_of.h"
#include "cleave/protocol/protocol.h"
#include "frame_bytes.h"

using namespace cleave;
using namespace cleave::transport;
using namespace cleave::protocol;

using cleave::transport::testing::aligned_copy;

namespace {

split::node_profile sample_profile(int n_blocks) {
  split::node_profile p;
  p.node_id = 7;
  p.batch = 32;
  p.backend = "onednn";
  p.memory_budget_bytes = 3ull << 30;
  for (int i = 0; i < n_blocks; ++i) {
    split::block_profile b;
    b.forward_seconds = 0.00025 * (i + 1);
    b.backward_seconds = 0.0005 * (i + 1);
    b.param_bytes = 1000u * static_cast<std::uint64_t>(i);
    b.state_bytes = 2000u * static_cast<std::uint64_t>(i);
    b.saved_bytes = 300u + static_cast<std::uint64_t>(i);
    b.output_bytes = 400u + static_cast<std::uint64_t>(i);
    p.blocks.push_back(b);
  }
  p.links.push_back({1, 850.f, 1.25e6f});
  p.links.push_back({4, 120.f, 1.0e9f});
  return p;
}

// The Profile body of a builder's frame, read without the inbound checks (for profile_of's own).
const wire::Profile& raw_profile(const message_builder& b) {
  const auto* root = flatbuffers::GetSizePrefixedRoot<wire::Message>(b.frame().data());
  REQUIRE(root->body_as<wire::Profile>() != nullptr);
  return *root->body_as<wire::Profile>();
}

}  // namespace

TEST_CASE("a node profile survives a round trip through a Profile message") {
  const split::node_profile sent = sample_profile(5);
  auto b = make_profile(sent, 3, 1234);
  auto decoded = decode_frame(aligned_copy(b.frame()), {});
  REQUIRE_MESSAGE(decoded.ok(), (decoded.ok() ? std::string() : decoded.error().reason()));
  const auto* m = decoded->as<wire::Profile>();
  REQUIRE(m != nullptr);
  CHECK(m->epoch() == 3);
  CHECK(m->step() == 1234);
  CHECK(m->blocks()->Get(2)->forward_us() == doctest::Approx(750.0));  // microseconds on the wire

  const split::node_profile got = profile_of(*m, 5);
  CHECK(got.node_id == 7);
  CHECK(got.batch == 32);
  CHECK(got.backend == "onednn");
  CHECK(got.memory_budget_bytes == 3ull << 30);
  REQUIRE(got.blocks.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(got.blocks[i].forward_seconds == doctest::Approx(sent.blocks[i].forward_seconds).epsilon(1e-6));
    CHECK(got.blocks[i].backward_seconds == doctest::Approx(sent.blocks[i].backward_seconds).epsilon(1e-6));
    CHECK(got.blocks[i].param_bytes == sent.blocks[i].param_bytes);
    CHECK(got.blocks[i].state_bytes == sent.blocks[i].state_bytes);
    CHECK(got.blocks[i].saved_bytes == sent.blocks[i].saved_bytes);
    CHECK(got.blocks[i].output_bytes == sent.blocks[i].output_bytes);
  }
  REQUIRE(got.links.size() == 2);
  CHECK(got.links[1].peer_id == 4);
  CHECK(got.links[1].rtt_us == 120.f);
  CHECK(got.links[0].bandwidth_bytes_per_s == 1.25e6f);
}

TEST_CASE("a profile with another block count than the model is refused") {
  auto b = make_profile(sample_profile(5), 1, 0);
  auto decoded = decode_frame(aligned_copy(b.frame()), {});
  REQUIRE(decoded.ok());
  const std::string e = cleave::testing::error_of([&] { profile_of(*decoded->as<wire::Profile>(), 12); });
  CHECK(e == "profile from node 7: 5 block profiles for a model of 12 blocks");
}

TEST_CASE("a profile whose blocks are out of order is refused") {
  // Built by hand: the protocol's builder numbers blocks in order.
  message_builder b;
  auto& f = b.fbb();
  std::vector<flatbuffers::Offset<wire::BlockProfile>> blocks;
  for (std::uint32_t block : {0u, 2u, 1u}) blocks.push_back(wire::CreateBlockProfile(f, block, 1.f, 2.f));
  const auto list = f.CreateVector(blocks);
  b.finish(wire::CreateProfile(f, 2, 0, 0, 0, list));
  const std::string e = cleave::testing::error_of([&] { profile_of(raw_profile(b), 3); });
  CHECK(e == "profile from node 2: entry 1 profiles block 2 (expected blocks in order from 0)");
}

TEST_CASE("a profile with a time that is not finite is refused") {
  split::node_profile p;
  p.node_id = 2;
  p.blocks.push_back({1e-6, 2e-6, 0, 0, 0, 0});
  p.blocks.push_back({1e-6, std::numeric_limits<double>::infinity(), 0, 0, 0, 0});
  auto b = make_profile(p, 0, 0);
  const std::string e = cleave::testing::error_of([&] { profile_of(raw_profile(b), 2); });
  CHECK(e.find("profile from node 2: block 1: backward time") == 0);
  CHECK(e.find("not a finite, non-negative value") != std::string::npos);
}
