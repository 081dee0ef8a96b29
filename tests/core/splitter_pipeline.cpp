// The splitter's pipelined cost model: the flow shop and the busy bounds on hand-computed figures,
// one micro-batch with f32 as the sequential model, codecs on the wire and their compute, the
// planner's choice of micro-batches and codecs, and the checks of the new inputs.
#include <doctest/doctest.h>

#include "../support/error_of.h"
#include "cleave/split/splitter.h"
#include "splitter_problems.h"

using namespace cleave;
using core::codec;
using split::route;
using split::route_choice;
using split::split_problem;
using testing::blank;
using testing::random_problem;

namespace {

// One block on the device (6 s: forward 2, backward 4), its 20-byte output over a 10 B/s link
// (2 s each way, rtt 0.5 s) to a server with nothing to run: stages 2 / M, 2 / M, 0, 2 / M, 4 / M
// (forward, up, server, down, backward), the link's 0.5 s latency once, and the device busy 6 s.
// Block 0 on the device, block 1 (the head) on the server, which runs it in no time: the board
// would take 100 s, so no plan keeps every block on the device.
split_problem two_stage() {
  auto p = blank(2, false, {-1}, 0);
  p.devices[0].board.block_seconds = {6.0, 100.0};
  p.cut_bytes = {0, 20, 0};
  p.devices[0].link = {10.0, 0.5};
  return p;
}

route_choice choice(int m, std::vector<core::hop_codecs> hops) {
  return route_choice{m, std::move(hops)};
}

// The sequential model: segments times shares and 2 * bytes / bandwidth per hop, added from the
// top of the path down, then one rtt per hop (added the same way).
double sequential_seconds(const split_problem& p, int d, const route& r) {
  const auto& dev = p.devices[static_cast<std::size_t>(d)];
  std::vector<double> terms, rtts;
  // Every block on the device: its loss there too, no hop.
  const int n_segments = r.device_only() ? 1 : r.n_segments();
  for (int k = 0; k < n_segments; ++k) {
    const auto t = r.path[static_cast<std::size_t>(k)];
    const auto& node = t == core::tier::device ? dev.board
                       : t == core::tier::edge ? p.edges[static_cast<std::size_t>(dev.edge)]
                                               : p.server;
    double share = 1;
    if (t == core::tier::server) share = static_cast<double>(p.devices.size());
    if (t == core::tier::edge)
      share = static_cast<double>(std::count_if(p.devices.begin(), p.devices.end(),
                                                [&](const split::device_costs& x) { return x.edge == dev.edge; }));
    double sum = 0;
    for (int i = r.begin(k); i < r.end(k); ++i) sum += node.block_seconds[static_cast<std::size_t>(i)];
    terms.push_back(sum * share);
    if (k + 1 == n_segments) break;
    const auto next = r.path[static_cast<std::size_t>(k + 1)];
    const auto& l = t == core::tier::device || next == core::tier::device
                        ? dev.link
                        : p.edge_links[static_cast<std::size_t>(dev.edge)];
    const double bytes = p.cut_bytes[static_cast<std::size_t>(r.end(k))];
    terms.push_back(l.bytes_per_second > 0 ? 2.0 * bytes / l.bytes_per_second : 0.0);
    rtts.push_back(l.rtt_seconds);
  }
  double total = terms.back();
  for (std::size_t j = terms.size() - 1; j-- > 0;) total = terms[j] + total;
  double latency = 0;
  for (std::size_t j = rtts.size(); j-- > 0;) latency = rtts[j] + latency;
  return total + latency;
}

}  // namespace

TEST_CASE("a step of M micro-batches is the flow shop's fill plus M - 1 longest stages, or a node's busy time") {
  const auto p = two_stage();
  const auto r = split::make_route(false, false, {1}, 2);
  const core::hop_codecs f32{};
  // M = 1: 6 + 4 + 0, and the latency.
  auto c = split::evaluate_route(p, 0, r, choice(1, {f32}));
  CHECK(c.seconds == 10.5);
  CHECK(c.busy_seconds == 0.0);
  // M = 2: stages 1, 1, 0, 1, 2: fill 5 + 0.5, then one more backward 2 = 7.5; the device's 6 s of
  // work fit (its second forward ends long before the first gradient is back at 3.5).
  c = split::evaluate_route(p, 0, r, choice(2, {f32}));
  CHECK(c.fill_seconds == 5.5);
  CHECK(c.bottleneck_seconds == 2.0);
  CHECK(c.busy_seconds == 6.0);
  CHECK(c.seconds == 5.5 + 1 * 2.0);
  // M = 4: stages 0.5, 0.5, 0, 0.5, 1: P = 2.5 + 0.5 + 3 * 1 = 6, the device's work 4 * 1.5 = 6.
  // Busy times stay whole steps.
  c = split::evaluate_route(p, 0, r, choice(4, {f32}));
  CHECK(c.seconds == 6.0);
  CHECK(c.busy_seconds == 6.0);
  CHECK(c.compute_seconds == 6.0);
  CHECK(c.transfer_seconds == 4.0);
  // M = 8: P = 1.25 + 0.5 + 7 * 0.5 = 5.25: the device's 6 s set the step.
  c = split::evaluate_route(p, 0, r, choice(8, {f32}));
  CHECK(c.seconds == 6.0);
  // A slower link: 40 bytes each way, 4 s per step and direction; at M = 4 stages 0.5, 1, 0, 1, 1:
  // 3.5 + 0.5 + 3 * 1 (up and down are separate resources, each 1 s a micro-batch).
  auto slow = p;
  slow.cut_bytes = {0, 40, 0};
  c = split::evaluate_route(slow, 0, r, choice(4, {f32}));
  CHECK(c.bottleneck_seconds == 1.0);
  CHECK(c.seconds == 7.0);
}

TEST_CASE("the planner picks the micro-batch count, and latency delays the fill once whatever it is") {
  auto p = two_stage();
  p.micro_batch_options = {8, 1, 4, 2};
  // M = 1: 10.5, M = 2: 7.5, M = 4 and M = 8: the device's 6 s (see above): the fewer wins the tie.
  auto plan = split::plan_best(p);
  CHECK(plan.choices[0] == choice(4, {{}}));
  CHECK(plan.cost.step_seconds == 6.0);
  // rtt 5 s: P pays it once whatever M (M = 1: 10 + 5; M = 8: 1.25 + 7 * 0.5 + 5 = 9.75, above the
  // device's 6 s: it waits for the first gradient).
  p.devices[0].link.rtt_seconds = 5.0;
  plan = split::plan_best(p);
  CHECK(plan.choices[0].n_micro_batches == 8);
  CHECK(plan.cost.step_seconds == 9.75);
  // Nothing to pipeline (no compute, nothing on the wire): every M ties, the fewest wins.
  p.devices[0].board.block_seconds = {0.0, 100.0};
  p.cut_bytes = {0, 0, 0};
  plan = split::plan_best(p);
  CHECK(plan.choices[0].n_micro_batches == 1);
  CHECK(plan.cost.step_seconds == 5.0);
}

TEST_CASE("measured forward times split a segment into its two passes") {
  // The same route with the forward 5 s of the 6: stages at M = 2 2.5, 1, 0, 1, 0.5: P = 5 + 0.5 +
  // 2.5 = 8 (the forward the longest stage), the device's 6 s below it.
  auto p = two_stage();
  p.devices[0].board.forward_seconds = {5.0, 0.0};
  const auto r = split::make_route(false, false, {1}, 2);
  auto c = split::evaluate_route(p, 0, r, choice(2, {{}}));
  CHECK(c.bottleneck_seconds == 2.5);
  CHECK(c.seconds == 8.0);
  // All of it forward: the last forward ends at 6 and its micro-batch's way up and back takes
  // 1 + 0.5 + 1 more (the backward nothing): 8.5 = P = 5 + 0.5 + 3.
  p.devices[0].board.forward_seconds = {6.0, 0.0};
  CHECK(split::evaluate_route(p, 0, r, choice(2, {{}})).seconds == 8.5);
  // One micro-batch: the split does not matter.
  CHECK(split::evaluate_route(p, 0, r, choice(1, {{}})).seconds == 10.5);
}

TEST_CASE("a U-shaped route's device and link each serve several stages") {
  // D S D, 3 blocks: the device holds [0, 1) and [2, 3) (3 s each, the bottom's forward 1 s), the
  // server [1, 2) (nothing), both cuts 10 bytes at 10 B/s (1 s each way per step), no latency. At
  // M = 2 the stages are f0 0.5, up 0.5, server 0, up 0.5, top 1.5, down 0.5, server 0, down 0.5,
  // b0 1: P = 5 + 1.5 = 6.5. The device's own work is 2 * (1.5 + 1.5) = 6. The device's link
  // carries hop 0's activation and hop 1's gradient up: f0 0.5 before, 2 * 1 on it, then the
  // server 0, down 0.5 and b0 1 after: 4.
  auto p = blank(3, true, {-1}, 0);
  p.devices[0].board.block_seconds = {3, 0, 3};
  p.cut_bytes = {0, 10, 10, 0};
  p.devices[0].link = {10.0, 0.0};
  const auto r = split::make_route(true, false, {1, 2}, 3);
  auto c = split::evaluate_route(p, 0, r, choice(2, {{}, {}}));
  CHECK(c.seconds == 6.5);
  CHECK(c.busy_seconds == 6.0);
  // M = 4: P = 2.5 + 3 * 0.75 = 4.75, below the device's 6 s.
  c = split::evaluate_route(p, 0, r, choice(4, {{}, {}}));
  CHECK(c.seconds == 6.0);
  // A slow link (100 bytes: 10 s each way per step): at M = 4 its up direction carries 2.5 + 2.5
  // a micro-batch, after the first forward (0.25) and before the server's backward (0), the way
  // down (2.5) and the bottom's backward (0.5): 0.25 + 4 * 5 + 3 = 23.25, above P = 11.5 + 3 * 2.5.
  p.cut_bytes = {0, 100, 100, 0};
  c = split::evaluate_route(p, 0, r, choice(4, {{}, {}}));
  CHECK(c.busy_seconds == 23.25);
  CHECK(c.seconds == 23.25);
}

TEST_CASE("one micro-batch with f32 both ways is the sequential model") {
  core::rng r(7);
  int n_routes = 0;
  for (int it = 0; it < 200; ++it) {
    auto p = random_problem(r);
    p.n_micro_batches = 1;
    for (int d = 0; d < static_cast<int>(p.devices.size()); ++d)
      for (const auto& rt : testing::all_routes(p, d)) {
        const double want = sequential_seconds(p, d, rt);
        CHECK(split::evaluate_route(p, d, rt).seconds == want);
        CHECK(split::evaluate_route(p, d, rt, split::default_choice(p, rt.path.size() - 1)).seconds == want);
        ++n_routes;
      }
  }
  CHECK(n_routes > 1000);
}

TEST_CASE("with no options the planner keeps the configured micro-batches and f32") {
  core::rng r(11);
  for (int it = 0; it < 50; ++it) {
    const auto p = random_problem(r);
    try {
      const auto plan = split::plan_best(p);
      for (std::size_t d = 0; d < plan.routes.size(); ++d)
        CHECK(plan.choices[d] == split::default_choice(p, plan.routes[d].path.size() - 1));
    } catch (const core::error&) {
    }
  }
}

TEST_CASE("smaller codecs shorten a hop and their compute lengthens it") {
  // 100 values (400 bytes) at 100 B/s: f32 4 s each way. The second block is slow on the device.
  auto p = blank(2, false, {-1}, 0);
  p.devices[0].board.block_seconds = {0, 100};
  p.cut_bytes = {0, 400, 0};
  p.cut_channels = {1, 2, 1};
  p.topk_fraction = 0.125f;
  p.devices[0].link = {100.0, 0.0};
  p.codecs = {{codec::f32, 0}, {codec::f16, 0}, {codec::int8, 0}, {codec::topk, 0}};
  const auto r = split::make_route(false, false, {1}, 2);
  auto hop = [&](codec up, codec down) {
    return split::evaluate_route(p, 0, r, choice(1, {{up, down}})).transfer_seconds;
  };
  CHECK(hop(codec::f32, codec::f32) == 8.0);
  CHECK(hop(codec::f16, codec::f16) == 4.0);
  CHECK(hop(codec::int8, codec::f16) == doctest::Approx(1.08 + 2.0));    // 100 values + 2 scales of 4 bytes
  CHECK(hop(codec::int8, codec::topk) == doctest::Approx(1.08 + 1.04));  // 13 values and positions, 8 bytes each
  auto plan = split::plan_best(p);
  CHECK(plan.choices[0] == choice(1, {{codec::int8, codec::topk}}));
  // int8 now costs 0.05 s a value to encode and decode: 5 s more, slower than f16 each way.
  p.codecs[2].seconds_per_value = 0.05;
  CHECK(hop(codec::int8, codec::topk) == doctest::Approx(6.08 + 1.04));
  plan = split::plan_best(p);
  CHECK(plan.choices[0] == choice(1, {{codec::f16, codec::topk}}));
  // f16 and bf16 take the same time: the first listed wins the tie.
  p.codecs = {{codec::f32, 0}, {codec::bf16, 0}, {codec::f16, 0}};
  CHECK(split::plan_best(p).choices[0] == choice(1, {{codec::bf16, codec::bf16}}));
}

TEST_CASE("decide_resplit prices the current routes under their choices") {
  auto p = two_stage();
  p.micro_batch_options = {1, 2, 4};
  const auto best = split::plan_best(p);
  const std::vector<route> current{split::make_route(false, false, {1}, 2)};
  // Same route: run at M = 1 it gains 10.5 -> 6; already at M = 4 nothing.
  const auto from_one = split::decide_resplit(p, current, {choice(1, {{}})}, best, {});
  CHECK(from_one.current_seconds == 10.5);
  CHECK(from_one.proposed_seconds == 6.0);
  CHECK(from_one.change);
  const auto from_four = split::decide_resplit(p, current, {choice(4, {{}})}, best, {});
  CHECK(from_four.current_seconds == 6.0);
  CHECK_FALSE(from_four.change);
  CHECK(testing::error_of([&] { split::decide_resplit(p, current, {}, best, {}); }) ==
        "plan has 0 route choices for 1 routes");
}

TEST_CASE("validate names the bad micro-batch, channel and codec fields") {
  const auto good = blank(3, false, {0, -1}, 1);
  auto check = [&](auto&& mutate, const std::string& want) {
    auto p = good;
    mutate(p);
    CHECK(testing::error_of([&] { split::validate(p); }) == want);
    CHECK(testing::error_of([&] { split::plan_best(p); }) == want);
    CHECK(testing::error_of([&] { split::plan_exhaustive(p); }) == want);
  };
  check(
      [](split_problem& p) {
        p.micro_batch_options = {2, 0};
      },
      "split problem: micro_batch_options[1] is 0, needs at least 1");
  check(
      [](split_problem& p) {
        p.micro_batch_options = {1, 2, 2};
      },
      "split problem: micro_batch_options[2] is 2, listed twice");
  check(
      [](split_problem& p) {
        p.batch = 6;
        p.micro_batch_options = {1, 2, 4};
      },
      "split problem: micro_batch_options[2] is 4, does not divide batch 6");
  check(
      [](split_problem& p) {
        p.batch = 6;
        p.n_micro_batches = 4;
      },
      "split problem: n_micro_batches is 4, does not divide batch 6");
  check([](split_problem& p) { p.batch = -1; }, "split problem: batch is -1 (must be >= 0)");
  check([](split_problem& p) { p.cut_channels = {1, 1}; }, "split problem: cut_channels has 2 entries, expected 4");
  check(
      [](split_problem& p) {
        p.cut_channels = {1, 1, -1, 1};
      },
      "split problem: cut_channels[2] is -1 (must be finite and >= 0)");
  check(
      [](split_problem& p) {
        p.codecs = {{codec::f16, 0}, {codec::f16, 1}};
      },
      "split problem: codecs[1] is f16, listed twice");
  check(
      [](split_problem& p) {
        p.codecs = {{static_cast<codec>(9), 0}};
      },
      "split problem: codecs[0] has codec id 9, not a codec");
  check(
      [](split_problem& p) {
        p.codecs = {{codec::int8, -1}};
      },
      "split problem: codecs[0].seconds_per_value is -1 (must be finite and >= 0)");
  check(
      [](split_problem& p) {
        p.codecs = {{codec::topk, 0}};
      },
      "split problem: codecs has no codec for activations (topk is for gradients only)");
  check([](split_problem& p) { p.topk_fraction = 0; }, "split problem: topk_fraction is 0 (must be in (0, 1])");
}

TEST_CASE("evaluate_route names what is wrong with a route choice") {
  auto p = blank(3, false, {0, -1}, 1);
  p.batch = 4;
  p.codecs = {{codec::f32, 0}, {codec::topk, 0}};
  const auto r = split::make_route(false, false, {2}, 3);
  auto err = [&](const route_choice& c) { return testing::error_of([&] { split::evaluate_route(p, 1, r, c); }); };
  CHECK(err(choice(1, {{codec::f32, codec::topk}})).empty());
  CHECK(err(choice(0, {{}})) == "route choice for device 1: n_micro_batches is 0, needs at least 1");
  CHECK(err(choice(3, {{}})) == "route choice for device 1: n_micro_batches is 3, does not divide batch 4");
  CHECK(err(choice(1, {})) == "route choice for device 1: hops has 0 entries, the route has 1 hops");
  CHECK(err(choice(1, {{codec::topk, codec::f32}})) ==
        "route choice for device 1: hops[0].up is topk, which is for gradients only");
  CHECK(err(choice(1, {{codec::f32, codec::int8}})) ==
        "route choice for device 1: hops[0].down is codec 3, not among the problem's codecs");
  CHECK(testing::error_of([&] {
          split::evaluate_plan(p, {r, r}, {choice(1, {{}})});
        }) == "plan has 1 route choices for 2 routes");
}

TEST_CASE("the planner matches exhaustive search on measured-looking figures") {
  // Milliseconds a block, megabytes a cut, Wi-Fi-like device links: no exact ties, bounds that
  // must hold through rounding.
  core::rng r(5);
  auto uni = [&](double a, double b) { return a + (b - a) * static_cast<double>(r.uniform()); };
  for (int it = 0; it < 40; ++it) {
    const bool u = it % 2 == 1;
    const int n = u ? 6 : 10;
    auto p = blank(n, u, {0, 1, -1, 0}, 2);
    for (auto& b : p.cut_bytes) b = uni(1e4, 2e6);
    p.cut_channels.assign(p.cut_bytes.size(), 64.0);
    for (std::size_t i = 0; i < p.fixed_bytes.size(); ++i) {
      p.fixed_bytes[i] = uni(1e5, 8e6);
      p.saved_bytes[i] = uni(1e5, 4e6);
    }
    for (auto& t : p.server.block_seconds) t = uni(1e-4, 5e-4);
    for (std::size_t e = 0; e < p.edges.size(); ++e) {
      for (auto& t : p.edges[e].block_seconds) t = uni(5e-4, 2e-3);
      p.edge_links[e] = {uni(5e8, 1.25e9), uni(2e-4, 1e-3)};
    }
    for (auto& d : p.devices) {
      for (auto& t : d.board.block_seconds) t = uni(1e-3, 1e-2);
      d.board.memory_budget = uni(1.5e7, 4e7);
      d.link = {uni(5e6, 5e7), uni(2e-3, 2e-2)};
    }
    p.batch = 64;
    p.micro_batch_options = {1, 2, 4, 8};
    p.codecs = {{codec::f32, 0}, {codec::f16, 0.5e-9}, {codec::int8, 1.5e-9}};
    if (!u) p.codecs.push_back({codec::topk, 6e-9});
    CAPTURE(it);
    auto [best, all, best_err, all_err] = testing::plan_both(p);
    REQUIRE(best_err == all_err);
    if (!best_err.empty()) continue;
    CHECK(best.cost.step_seconds == all.cost.step_seconds);
    CHECK(best.routes == all.routes);
    CHECK(best.choices == all.choices);
  }
}
