// The cut codecs: names and sets, wire sizes, and round trips within each codec's error bound.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "../support/error_of.h"
#include "cleave/core/codec.h"

using namespace cleave;
using core::codec;

namespace {

std::vector<float> gaussian(std::size_t n, std::uint32_t seed, float sigma = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace

TEST_CASE("codec sets parse, print and reject what they do not know") {
  const auto s = core::parse_codec_set("f16,int8:stochastic,topk:0.05");
  CHECK(s.allows(codec::f32));  // always
  CHECK(s.allows(codec::f16));
  CHECK(s.allows(codec::int8));
  CHECK(s.stochastic);
  CHECK(s.topk_fraction == doctest::Approx(0.05f));
  CHECK(!s.topk_feedback);
  CHECK(core::parse_codec_set(s.str()).str() == s.str());
  const auto fb = core::parse_codec_set("topk:0.02:feedback");
  CHECK(fb.topk_feedback);
  CHECK(fb.topk_fraction == doctest::Approx(0.02f));
  CHECK(core::parse_codec_set(fb.str()).str() == fb.str());
  CHECK(core::parse_codec_set("topk:feedback").topk_fraction == doctest::Approx(0.1f));
  CHECK(testing::error_of([] { core::parse_codec_set("topk:0.1:back"); }).find("'back' is not in (0, 1]") !=
        std::string::npos);
  CHECK(testing::error_of([] { core::parse_codec_set("f16,int4"); }).find("unknown codec 'int4'") != std::string::npos);
  CHECK(testing::error_of([] { core::parse_codec_set("topk:1.5"); }).find("'1.5' is not in (0, 1]") !=
        std::string::npos);
  CHECK(testing::error_of([] { core::parse_codec_set("f16:2"); }).find("only topk takes a fraction") !=
        std::string::npos);
  CHECK(!testing::error_of([] { core::parse_codec_set(""); }).empty());
}

TEST_CASE("a fixed plan takes the most compact allowed codec per direction") {
  CHECK(core::compact_codecs(core::parse_codec_set("f32")) == core::hop_codecs{});
  CHECK(core::compact_codecs(core::parse_codec_set("bf16,f16")) == core::hop_codecs{codec::bf16, codec::bf16});
  CHECK(core::compact_codecs(core::parse_codec_set("f16,int8")) == core::hop_codecs{codec::int8, codec::int8});
  // topk carries gradients only.
  CHECK(core::compact_codecs(core::parse_codec_set("int8,topk:0.1")) == core::hop_codecs{codec::int8, codec::topk});
  // topk keeping most values is larger than int8.
  CHECK(core::compact_codecs(core::parse_codec_set("int8,topk:0.5")) == core::hop_codecs{codec::int8, codec::int8});
}

TEST_CASE("wire sizes of each codec") {
  CHECK(core::encoded_bytes(codec::f32, 1000, 10, 0.1f) == 4000);
  CHECK(core::encoded_bytes(codec::f16, 1000, 10, 0.1f) == 2000);
  CHECK(core::encoded_bytes(codec::bf16, 1000, 10, 0.1f) == 2000);
  CHECK(core::encoded_bytes(codec::int8, 1000, 10, 0.1f) == 1040);
  CHECK(core::encoded_bytes(codec::topk, 1000, 10, 0.1f) == 800);
}

TEST_CASE("f16 and bf16 round trips are within half a unit in the last place") {
  auto x = gaussian(4096, 1, 3.0f);
  x.push_back(0.0f);
  x.push_back(-0.0f);
  x.push_back(1e-3f);
  std::vector<std::uint16_t> h(x.size());
  std::vector<float> y(x.size());
  core::encode_f16(x.data(), h.data(), static_cast<std::int64_t>(x.size()));
  core::decode_f16(h.data(), y.data(), static_cast<std::int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) {
    // Normal f16 values: 11 significant bits, error <= 2^-11 relative; subnormals: 2^-25 absolute.
    CHECK(std::fabs(y[i] - x[i]) <= std::max(std::fabs(x[i]) * 0x1p-11f, 0x1p-25f));
  }
  core::encode_bf16(x.data(), h.data(), static_cast<std::int64_t>(x.size()));
  core::decode_bf16(h.data(), y.data(), static_cast<std::int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::fabs(y[i] - x[i]) <= std::fabs(x[i]) * 0x1p-8f);
  // Values f16 cannot hold saturate to infinity, as a cast would; bf16 keeps f32's range.
  const float big[2] = {1e6f, -1e6f};
  core::encode_f16(big, h.data(), 2);
  core::decode_f16(h.data(), y.data(), 2);
  CHECK(std::isinf(y[0]));
  CHECK(y[1] < 0);
  core::encode_bf16(big, h.data(), 2);
  core::decode_bf16(h.data(), y.data(), 2);
  CHECK(y[0] == doctest::Approx(1e6f).epsilon(0.01));
}

TEST_CASE("int8 with a scale per channel is within half a step, and unbiased when stochastic") {
  const std::int64_t dims[4] = {8, 5, 3, 3};
  const auto l = core::channel_layout_of(dims, 4);
  CHECK(l.outer == 8);
  CHECK(l.channels == 5);
  CHECK(l.inner == 9);
  auto x = gaussian(8 * 5 * 9, 2);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] *= static_cast<float>(1 + (i / 9) % 5);  // channels differ
  for (std::size_t i = 0; i < x.size(); i += 45) x[i + 9] = 0;                             // a few zeros
  std::vector<std::int8_t> q(x.size());
  std::vector<float> scales(5), y(x.size());
  core::encode_int8(x.data(), l, q.data(), scales.data(), false, 0);
  core::decode_int8(q.data(), scales.data(), l, y.data());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float s = scales[(i / 9) % 5];
    CHECK(std::fabs(y[i] - x[i]) <= 0.5f * s * (1 + 1e-5f));
  }
  // The largest value of each channel is exact to rounding of the scale.
  // Stochastic rounding: the mean of many draws approaches the value.
  const float one[4] = {1.0f, 0.3f, -0.55f, 0.01f};
  const core::channel_layout flat{1, 1, 4};
  std::vector<double> mean(4, 0.0);
  const int draws = 4000;
  for (int d = 0; d < draws; ++d) {
    std::int8_t qq[4];
    float sc = 0, yy[4];
    core::encode_int8(one, flat, qq, &sc, true, static_cast<std::uint32_t>(d));
    core::decode_int8(qq, &sc, flat, yy);
    for (int i = 0; i < 4; ++i) {
      CHECK(std::fabs(yy[i] - one[i]) <= sc * (1 + 1e-5f));  // within one step
      mean[static_cast<std::size_t>(i)] += yy[i] / draws;
    }
  }
  for (int i = 0; i < 4; ++i) CHECK(mean[static_cast<std::size_t>(i)] == doctest::Approx(one[i]).epsilon(0.01));
}

TEST_CASE("int8 marks a channel holding a non-finite value, and an all-zero channel decodes to zeros") {
  const float x[6] = {1.0f, std::numeric_limits<float>::infinity(), 0.0f, 0.0f, 2.0f, -2.0f};
  const core::channel_layout l{1, 3, 2};
  std::int8_t q[6];
  float s[3], y[6];
  core::encode_int8(x, l, q, s, false, 0);
  CHECK(std::isnan(s[0]));
  CHECK(s[1] == 0.0f);
  core::decode_int8(q, s, l, y);
  CHECK(std::isnan(y[0]));
  CHECK(y[2] == 0.0f);
  CHECK(y[3] == 0.0f);
  CHECK(y[4] == doctest::Approx(2.0f));
}

TEST_CASE("topk keeps the largest magnitudes and feeds back what it left out") {
  CHECK(core::topk_count(1000, 0.1f) == 100);
  CHECK(core::topk_count(3, 0.1f) == 1);
  CHECK(core::topk_count(0, 0.1f) == 0);
  const float x[6] = {0.1f, -3.0f, 0.2f, 2.0f, -0.2f, 0.0f};
  float residual[6] = {0, 0, 0, 0, 0, 0};
  float values[2];
  std::uint32_t pos[2];
  core::encode_topk(x, 6, 2, residual, values, pos);
  CHECK(pos[0] == 1);
  CHECK(pos[1] == 3);
  CHECK(values[0] == -3.0f);
  CHECK(values[1] == 2.0f);
  CHECK(residual[1] == 0.0f);
  CHECK(residual[2] == doctest::Approx(0.2f));
  // The sum of what was sent and what remains is the input: nothing is lost.
  float y[6];
  core::decode_topk(values, pos, 2, y, 6);
  for (int i = 0; i < 6; ++i) CHECK(y[i] + residual[i] == doctest::Approx(x[i]));
  // Ties go to the lower position; the fed-back values get sent eventually.
  const float zero[6] = {0, 0, 0, 0, 0, 0};
  core::encode_topk(zero, 6, 2, residual, values, pos);
  CHECK(pos[0] == 2);  // 0.2 and -0.2: the lower position first, both kept
  CHECK(pos[1] == 4);
}

TEST_CASE("topk with error feedback: the running sum of decoded values tracks the running sum of inputs") {
  const std::int64_t n = 512, k = core::topk_count(n, 0.05f);
  std::vector<float> residual(n, 0.0f), values(static_cast<std::size_t>(k)), y(n), sent(n, 0.0f), total(n, 0.0f);
  std::vector<std::uint32_t> pos(static_cast<std::size_t>(k));
  for (std::uint32_t step = 0; step < 200; ++step) {
    const auto x = gaussian(n, 100 + step);
    core::encode_topk(x.data(), n, k, residual.data(), values.data(), pos.data());
    core::decode_topk(values.data(), pos.data(), k, y.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      sent[i] += y[i];
      total[i] += x[i];
      CHECK(sent[i] + residual[i] == doctest::Approx(total[i]).epsilon(1e-3));
    }
    for (std::int64_t j = 1; j < k; ++j) CHECK(pos[j - 1] < pos[j]);
  }
}
