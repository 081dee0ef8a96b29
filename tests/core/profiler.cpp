// Per-block profiles of a zoo model on the reference backend, the warm-up-dropping moving
// average, and the live rescaling of profiled times by measured segment times.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>

#include "../support/error_of.h"
#include "cleave/backend/registry.h"
#include "cleave/core/stage.h"
#include "cleave/split/profiler.h"

using namespace cleave;
using core::shape;
using split::block_profile;
using split::live_profile;

namespace {

block_profile timed(double fwd, double bwd) {
  block_profile p;
  p.forward_seconds = fwd;
  p.backward_seconds = bwd;
  return p;
}

// Four blocks with distinct times (seconds per micro-batch).
std::vector<block_profile> four_blocks() {
  return {timed(1, 2), timed(0.5, 0.5), timed(2, 4), timed(0.25, 0.75)};
}

double sum_of(const std::vector<block_profile>& b, int begin, int end) {
  double s = 0;
  for (int i = begin; i < end; ++i)
    s += b[static_cast<std::size_t>(i)].forward_seconds + b[static_cast<std::size_t>(i)].backward_seconds;
  return s;
}

}  // namespace

TEST_CASE("a profile of lenet5 covers every block with its times, memory and crossing bytes") {
  auto b = backend::make_backend("reference");
  const auto m = core::zoo_model("lenet5", shape{1, 28, 28}, 10);
  split::profile_options o;
  o.batch = 8;
  o.warmup = 1;
  o.reps = 3;
  const core::optimizer_config sgd;  // momentum 0.9: one state tensor per parameter
  const auto prof = split::profile_blocks(*b, m, sgd, o);
  REQUIRE(prof.size() == 12);
  int n_weighted = 0, n_relu = 0, n_pool = 0;
  for (int i = 0; i < m.n_blocks(); ++i) {
    const auto& bi = m.blocks[static_cast<std::size_t>(i)];
    const auto& p = prof[static_cast<std::size_t>(i)];
    CAPTURE(i);
    CAPTURE(bi.kind);
    core::stage s(*b, m, i, i + 1, 1);
    CHECK(p.param_bytes == static_cast<std::uint64_t>(s.n_params() + s.n_buffers()) * 4);
    CHECK(p.state_bytes == static_cast<std::uint64_t>(s.n_params()) * 4 * 2);
    CHECK(p.output_bytes == static_cast<std::uint64_t>(bi.out.numel()) * 4);
    CHECK(p.forward_seconds >= 0);
    CHECK(p.backward_seconds >= 0);
    if (bi.kind == "conv2d" || bi.kind == "linear") {
      ++n_weighted;
      CHECK(p.param_bytes > 0);
      CHECK(p.forward_seconds > 0);
      CHECK(p.backward_seconds > 0);
      // Both keep their input for the weight gradient.
      CHECK(p.saved_bytes == static_cast<std::uint64_t>(bi.in.numel()) * 4);
    }
    if (bi.kind == "relu") {
      ++n_relu;
      CHECK(p.saved_bytes == static_cast<std::uint64_t>(bi.out.numel()) * 4);
    }
    if (bi.kind == "maxpool2d") {
      ++n_pool;
      CHECK(p.saved_bytes > 0);
    }
    if (bi.kind == "flatten") CHECK(p.saved_bytes == 0);
  }
  CHECK(n_weighted == 5);
  CHECK(n_relu == 4);
  CHECK(n_pool == 2);
  CHECK(prof[0].param_bytes == (6 * 1 * 5 * 5 + 6) * 4);
  CHECK(prof[11].output_bytes == 10 * 4);
}

TEST_CASE("optimizer state in a profile follows the optimizer: none for plain sgd, two tensors for adamw") {
  auto b = backend::make_backend("reference");
  const auto m = core::zoo_model("mlp", shape{1, 8, 8}, 10);
  split::profile_options o;
  o.batch = 2;
  o.warmup = 0;
  o.reps = 1;
  core::optimizer_config plain;
  plain.momentum = 0;
  core::optimizer_config adamw;
  adamw.kind = core::optimizer_kind::adamw;
  const auto p_plain = split::profile_blocks(*b, m, plain, o);
  const auto p_adamw = split::profile_blocks(*b, m, adamw, o);
  REQUIRE(p_plain.size() == static_cast<std::size_t>(m.n_blocks()));
  for (int i = 0; i < m.n_blocks(); ++i) {
    CAPTURE(i);
    const std::uint64_t grads = static_cast<std::uint64_t>(m.blocks[static_cast<std::size_t>(i)].n_params) * 4;
    CHECK(p_plain[static_cast<std::size_t>(i)].state_bytes == grads);
    CHECK(p_adamw[static_cast<std::size_t>(i)].state_bytes == 3 * grads);
  }
  CHECK(p_plain[1].state_bytes > 0);  // linear(256)
}

TEST_CASE("a block over the memory budget is priced from the spec and its FLOPs, never allocated") {
  auto b = backend::make_backend("reference");
  const auto m = core::zoo_model("lenet5", shape{1, 28, 28}, 10);
  const core::optimizer_config sgd;
  const int fc1 = 7;  // linear 400 -> 120: the block with the most parameters
  REQUIRE(m.blocks[fc1].kind == "linear");
  // What a batch of 4 needs of each block, from the spec: fc1 needs the most.
  std::uint64_t others = 0;
  for (int i = 0; i < m.n_blocks(); ++i)
    if (i != fc1) others = std::max(others, split::least_segment_bytes(m, i, i + 1, sgd, 4));
  const std::uint64_t need = split::least_segment_bytes(m, fc1, fc1 + 1, sgd, 4);
  CHECK(need == (3 * (400 * 120 + 120) + 4 * (400 + 120)) * 4);
  REQUIRE(others < need);
  split::profile_options o;
  o.batch = 4;
  o.warmup = 0;
  o.reps = 1;
  o.memory_budget = need - 1;
  std::uint64_t calls = 0;
  o.clock = [&calls] { return static_cast<double>(++calls); };  // every timed call takes 1 s
  const auto prof = split::profile_blocks(*b, m, sgd, o);
  REQUIRE(prof.size() == 12);
  // Eleven blocks were timed (two clock reads per forward and per backward), fc1 was not.
  CHECK(calls == 11 * 4);
  const auto& p = prof[fc1];
  CHECK(p.param_bytes == (400 * 120 + 120) * 4);
  CHECK(p.state_bytes == (400 * 120 + 120) * 4 * 2);
  CHECK(p.output_bytes == 120 * 4);
  // Its times: its FLOPs at the rate of the measured blocks (1 s each way per block).
  double flops = 0;
  for (int i = 0; i < m.n_blocks(); ++i)
    if (i != fc1) flops += m.blocks[static_cast<std::size_t>(i)].flops;
  CHECK(p.forward_seconds == doctest::Approx(m.blocks[fc1].flops * 11 / flops));
  CHECK(p.backward_seconds == doctest::Approx(m.blocks[fc1].flops * 11 / flops));
  // Spans add up; an empty one needs nothing.
  CHECK(split::least_segment_bytes(m, 3, 3, sgd, 4) == 0);
  CHECK(split::least_segment_bytes(m, 0, 12, sgd, 4) > need);
}

TEST_CASE("profiling refuses options without a batch or a timed run") {
  auto b = backend::make_backend("reference");
  const auto m = core::zoo_model("mlp", shape{1, 8, 8}, 10);
  split::profile_options o;
  o.reps = 0;
  CHECK(testing::error_of([&] { split::profile_blocks(*b, m, {}, o); }).find("reps 0") != std::string::npos);
  o.reps = 1;
  o.batch = 0;
  CHECK(testing::error_of([&] { split::profile_blocks(*b, m, {}, o); }).find("batch 0") != std::string::npos);
}

TEST_CASE("a profile keeps each block's undisturbed time when most timed runs are slowed by outliers") {
  auto b = backend::make_backend("reference");
  const auto m = core::zoo_model("mlp", shape{1, 8, 8}, 10);
  split::profile_options o;
  o.batch = 4;
  o.warmup = 2;
  o.reps = 5;
  // A clock read before and after every timed call: forward takes 1 ms and backward 2 ms, except
  // that three of the five timed runs are 40 times slower (as under contention, where the median
  // is disturbed too), and the untimed warm-up runs are implausibly fast (they must not count).
  const int calls_per_block = (o.warmup + o.reps) * 4;
  int n_calls = 0;
  double t = 100.0;
  o.clock = [&] {
    const int k = n_calls++ % calls_per_block;
    if (k % 2 == 1) {  // the end of a timed call
      const int run = k / 4;
      const bool backward = (k / 2) % 2 == 1;
      const double undisturbed = backward ? 2e-3 : 1e-3;
      const bool disturbed = run == 2 || run == 3 || run == 5;
      t += run < o.warmup ? 1e-6 : disturbed ? 40 * undisturbed : undisturbed;
    }
    return t;
  };
  const auto prof = split::profile_blocks(*b, m, {}, o);
  CHECK(n_calls == calls_per_block * m.n_blocks());
  REQUIRE(prof.size() == static_cast<std::size_t>(m.n_blocks()));
  for (const auto& p : prof) {
    CHECK(p.forward_seconds == doctest::Approx(1e-3).epsilon(1e-9));
    CHECK(p.backward_seconds == doctest::Approx(2e-3).epsilon(1e-9));
  }
}

TEST_CASE("the moving average drops its warm-up samples, then follows new ones") {
  split::ewma e(0.5, 2);
  CHECK_FALSE(e.ready());
  e.add(100);
  e.add(100);
  CHECK_FALSE(e.ready());
  CHECK(e.value() == 0);
  CHECK(e.n_samples() == 2);
  e.add(4);
  REQUIRE(e.ready());
  CHECK(e.value() == doctest::Approx(4));
  e.add(8);
  CHECK(e.value() == doctest::Approx(6));
  CHECK(e.n_samples() == 4);
  e.reset();
  CHECK_FALSE(e.ready());
  CHECK(e.n_samples() == 0);
}

TEST_CASE("the moving average converges to a new steady value") {
  split::ewma e;  // alpha 0.3, warm-up 2
  for (int i = 0; i < 5; ++i) e.add(1.0);
  CHECK(e.value() == doctest::Approx(1.0));
  for (int i = 0; i < 40; ++i) e.add(10.0);
  CHECK(e.value() == doctest::Approx(10.0).epsilon(1e-4));
}

TEST_CASE("the moving average refuses a weight outside 0 to 1 or a negative warm-up") {
  CHECK(testing::error_of([] { split::ewma(0.0, 2); }).find("alpha") != std::string::npos);
  CHECK(testing::error_of([] { split::ewma(1.5, 2); }).find("alpha") != std::string::npos);
  CHECK(testing::error_of([] { split::ewma(0.3, -1); }).find("warmup -1") != std::string::npos);
}

TEST_CASE("a live profile without observations is the base times times the micro-batches") {
  const auto base = four_blocks();
  const live_profile lp(base);
  const auto s = lp.step_seconds(3);
  REQUIRE(s.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(lp.scale_of(i) == 1.0);
    CHECK(s[static_cast<std::size_t>(i)] == doctest::Approx(3 * sum_of(base, i, i + 1)));
  }
}

TEST_CASE("a node four times slower than profiled shows four times the step time after the warm-up") {
  const auto base = four_blocks();
  live_profile lp(base);  // warm-up 2
  const int n_micro = 4;
  const double measured = 4.0 * n_micro * sum_of(base, 0, 4);
  lp.observe(0, 4, measured, n_micro);
  lp.observe(0, 4, measured, n_micro);
  CHECK(lp.scale_of(0) == 1.0);  // still warming up
  lp.observe(0, 4, measured, n_micro);
  for (int i = 0; i < 4; ++i) CHECK(lp.scale_of(i) == doctest::Approx(4.0));
  const auto s = lp.step_seconds(n_micro);
  for (int i = 0; i < 4; ++i)
    CHECK(s[static_cast<std::size_t>(i)] == doctest::Approx(4.0 * n_micro * sum_of(base, i, i + 1)));
  // Another micro-batch count scales the same per-micro-batch measurement.
  CHECK(lp.step_seconds(1)[2] == doctest::Approx(4.0 * sum_of(base, 2, 3)));
}

TEST_CASE("a live profile of a real lenet5 profile follows a 4x slowdown") {
  auto b = backend::make_backend("reference");
  const auto m = core::zoo_model("lenet5", shape{1, 28, 28}, 10);
  split::profile_options o;
  o.batch = 4;
  o.warmup = 0;
  o.reps = 1;
  const auto prof = split::profile_blocks(*b, m, {}, o);
  live_profile lp(prof);
  const auto before = lp.step_seconds(2);
  const double total = std::accumulate(before.begin(), before.end(), 0.0);
  for (int k = 0; k < 3; ++k) lp.observe(0, m.n_blocks(), 4.0 * total, 2);
  const auto after = lp.step_seconds(2);
  for (std::size_t i = 0; i < after.size(); ++i) CHECK(after[i] == doctest::Approx(4.0 * before[i]));
}

TEST_CASE("blocks outside every observed segment take the scale of the nearest one") {
  const auto base = four_blocks();
  live_profile lp(base);
  for (int k = 0; k < 3; ++k) lp.observe(0, 1, 2.0 * sum_of(base, 0, 1), 1);
  for (int k = 0; k < 3; ++k) lp.observe(3, 4, 0.5 * 2 * sum_of(base, 3, 4), 2);
  CHECK(lp.scale_of(0) == doctest::Approx(2.0));
  CHECK(lp.scale_of(1) == doctest::Approx(2.0));  // next to [0, 1)
  CHECK(lp.scale_of(2) == doctest::Approx(0.5));  // next to [3, 4)
  CHECK(lp.scale_of(3) == doctest::Approx(0.5));
}

TEST_CASE("a segment seen more recently overrides an older one over the same blocks") {
  const auto base = four_blocks();
  live_profile lp(base);
  for (int k = 0; k < 3; ++k) lp.observe(0, 4, 3.0 * sum_of(base, 0, 4), 1);
  CHECK(lp.scale_of(1) == doctest::Approx(3.0));
  for (int k = 0; k < 3; ++k) lp.observe(0, 2, sum_of(base, 0, 2), 1);  // after a re-split
  CHECK(lp.scale_of(0) == doctest::Approx(1.0));
  CHECK(lp.scale_of(1) == doctest::Approx(1.0));
  CHECK(lp.scale_of(3) == doctest::Approx(3.0));
}

TEST_CASE("a live profile ignores empty segments and refuses bad ranges, counts and times") {
  live_profile lp(four_blocks());
  lp.observe(2, 2, 100.0, 1);
  lp.observe(2, 2, 100.0, 1);
  lp.observe(2, 2, 100.0, 1);
  CHECK(lp.scale_of(2) == 1.0);
  CHECK(testing::error_of([&] { lp.observe(3, 5, 1.0, 1); }).find("segment [3, 5) is outside the model's 4 blocks") !=
        std::string::npos);
  CHECK(testing::error_of([&] { lp.observe(0, 1, 1.0, 0); }).find("0 micro-batches") != std::string::npos);
  CHECK(testing::error_of([&] { lp.observe(0, 1, -1.0, 1); }).find("not a finite") != std::string::npos);
  CHECK(testing::error_of([&] { lp.step_seconds(0); }).find("0 micro-batches") != std::string::npos);
}
