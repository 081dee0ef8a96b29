// Cut tensors between backends and frames: every backend encodes a step tensor into the very
// frame the host encoder writes (the codecs run where the tensor lives), and decodes a received
// one to the host decoder's values.
#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../support/backend_harness.h"
#include "cleave/protocol/protocol.h"
#include "cleave/protocol/tensor_io.h"
#include "frame_bytes.h"

using namespace cleave;
using cleave::transport::testing::aligned_copy;

namespace {

core::backend& backend_named(const std::string& name) {
  static std::map<std::string, std::unique_ptr<core::backend>> cache;
  auto& slot = cache[name];
  if (!slot) slot = backend::make_backend(name);
  return *slot;
}

std::vector<std::string> every_backend() {
  auto names = cleave::testing::backends_under_test();
  names.insert(names.begin(), "reference");
  return names;
}

// Values with every case a codec treats apart: an all-zero channel, a NaN and an infinity in
// others, rounding ties of f16 / bf16, and a spread of magnitudes.
std::vector<float> cut_values(const core::shape& s) {
  auto v = cleave::testing::random_vec(s.numel(), 21, -4.0f, 4.0f);
  const std::int64_t inner = s.numel_from(2), channels = s[1];
  for (std::int64_t e = 0; e < s.numel(); ++e) {
    const std::int64_t c = (e / inner) % channels;
    auto& x = v[static_cast<std::size_t>(e)];
    if (c == 0) x = 0.0f;
    if (e % 7 == 0) x = 1.0009765625f * static_cast<float>(e % 5);  // f16 / bf16 ties
    if (e % 13 == 0) x *= 1e-3f;
  }
  v[static_cast<std::size_t>(2 * inner + 3)] = std::numeric_limits<float>::quiet_NaN();
  v[static_cast<std::size_t>(3 * inner + 1)] = -std::numeric_limits<float>::infinity();
  return v;
}

std::vector<std::byte> frame_of(const transport::message_builder& m) {
  return {m.frame().begin(), m.frame().end()};
}

std::vector<std::uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

}  // namespace

TEST_CASE("every backend encodes a cut tensor into the host encoder's frame, and decodes it to the host's values") {
  const core::shape s{3, 5, 4, 6};
  const auto x = cut_values(s);
  struct variant {
    const char* name;
    core::codec_spec spec;
  };
  const variant variants[] = {{"f16", {core::codec::f16}},
                              {"bf16", {core::codec::bf16}},
                              {"int8", {core::codec::int8}},
                              {"int8 stochastic", {core::codec::int8, 0.1f, true, 99u}},
                              {"topk", {core::codec::topk, 0.1f}}};
  const protocol::step_key key{1, 2, 0, 3, 1};
  for (const auto& v : variants) {
    CAPTURE(v.name);
    // The host encoder's frame: the reference backend's buffers are host memory.
    auto& ref = backend_named("reference");
    const auto want = frame_of(protocol::make_gradients(key, ref, cleave::testing::make(ref, s, x), 0.5f, 1, v.spec));
    auto decoded = transport::decode_frame(aligned_copy(want), {});
    REQUIRE(decoded.ok());
    const auto view = transport::view_of(*decoded->as<wire::Gradients>()->gradient());
    std::vector<float> host(x.size());
    view.decode(host.data());
    for (const auto& name : every_backend()) {
      CAPTURE(name);
      auto& b = backend_named(name);
      const auto got = frame_of(protocol::make_gradients(key, b, cleave::testing::make(b, s, x), 0.5f, 1, v.spec));
      CHECK(got == want);
      const core::tensor t = protocol::to_backend(b, view);
      CHECK(t.dtype() == core::dtype::f32);
      CHECK(t.shape() == s);
      CHECK(bits_of(cleave::testing::read(b, t)) == bits_of(host));
    }
  }
}
