// Split training through segment hosts (no network) equals local training, for every route
// shape; block averages combine associatively.
#include <doctest/doctest.h>

#include "../support/backend_harness.h"
#include "../support/error_of.h"
#include "cleave/core/trainer.h"
#include "cleave/split/aggregate.h"
#include "cleave/split/pipeline.h"
#include "cleave/split/split_step.h"

using namespace cleave;
using core::shape;
using core::tensor;

namespace {

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(
        worst, std::fabs(static_cast<double>(a[i]) - b[i]) / std::max(1e-3, std::fabs(static_cast<double>(b[i]))));
  return worst;
}

// Data, the local oracle and the hosts of one device's route on three reference backends.
struct split_rig {
  core::model_spec m = core::zoo_model("lenet5", shape{1, 28, 28}, 10);
  core::optimizer_config oc;
  std::uint64_t seed = 11;
  int steps = 20, n = 16;
  std::vector<float> data = testing::random_vec(steps * n * 784, 2);
  std::vector<std::int32_t> labels;
  std::map<core::tier, std::unique_ptr<core::backend>> be;
  std::map<core::tier, std::unique_ptr<split::segment_host>> hosts;

  explicit split_rig(core::optimizer_config o = {}) : oc(o) {
    labels.resize(static_cast<std::size_t>(steps * n));
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>((i * 7) % 10);
    for (auto t : {core::tier::device, core::tier::edge, core::tier::server}) {
      be[t] = backend::make_backend("reference");
      hosts[t] = std::make_unique<split::segment_host>(*be[t], m, oc, seed);
    }
  }

  std::vector<float> local_params() {
    auto ref = backend::make_backend("reference");
    core::train_config tc;
    tc.seed = seed;
    tc.opt = oc;
    core::trainer local(*ref, m, tc);
    for (int s = 0; s < steps; ++s) local.step(data.data() + s * n * 784, labels.data() + s * n, n);
    return testing::read(*ref, local.model_stage().params());
  }

  void host(const split::route& r) {
    for (auto& [t, h] : hosts)
      for (int seg : r.segments_on(t)) h->host(7, r, seg);
  }

  // One step of device 7 along route r (split::split_step).
  split::split_step_result step(const split::route& r, int s, int micro_batches) {
    auto& dev = *be[core::tier::device];
    tensor x = testing::make(dev, {n, 1, 28, 28},
                             std::vector<float>(data.begin() + s * n * 784, data.begin() + (s + 1) * n * 784));
    tensor y = testing::make_typed(dev, {n}, core::dtype::i32,
                                   std::vector<std::int32_t>(labels.begin() + s * n, labels.begin() + (s + 1) * n));
    split::tier_hosts on;
    for (auto& [t, h] : hosts) on[t] = h.get();
    const auto res =
        split::split_step(on, 7, r, static_cast<std::uint64_t>(s), x, y, static_cast<std::uint32_t>(micro_batches));
    const int seg = res.end_segment;
    CHECK(seg == 0);
    return res;
  }

  // The whole model's parameters reassembled from the segments of route r.
  std::vector<float> params(const split::route& r) {
    std::vector<float> got;
    for (int seg = 0; seg < r.n_segments(); ++seg) {
      const auto t = r.path[static_cast<std::size_t>(seg)];
      auto v = testing::read(*be[t], hosts[t]->stage_of(7, seg).params());
      got.insert(got.end(), v.begin(), v.end());
    }
    return got;
  }
};

}  // namespace

TEST_CASE("split training through segment hosts equals local training for every route shape") {
  struct shape_case {
    bool u, edge;
    std::vector<int> cuts;
    int micro_batches;
  };
  for (const auto& sc :
       {shape_case{false, false, {4}, 1}, shape_case{false, true, {3, 7}, 1}, shape_case{true, false, {6, 11}, 1},
        shape_case{true, true, {2, 6, 9, 11}, 1}, shape_case{false, true, {3, 7}, 4}}) {
    split_rig rig;  // SGD 0.05, momentum 0.9
    const auto want = rig.local_params();
    const auto r = split::make_route(sc.u, sc.edge, sc.cuts, rig.m.n_blocks());
    CAPTURE(r.str());
    CAPTURE(sc.micro_batches);
    rig.host(r);
    for (int s = 0; s < rig.steps; ++s) rig.step(r, s, sc.micro_batches);
    const auto got = rig.params(r);
    REQUIRE(got.size() == want.size());
    // Micro-batches change only the summation order of the gradients.
    CHECK(max_rel_diff(got, want) <= (sc.micro_batches == 1 ? 1e-6 : 1e-4));
    CHECK(rig.hosts[core::tier::server]->n_pending() == 0);
  }
}

TEST_CASE("the split step reports each step's loss as local training does") {
  for (const int micro_batches : {1, 4}) {
    CAPTURE(micro_batches);
    split_rig rig;
    auto ref = backend::make_backend("reference");
    core::train_config tc;
    tc.seed = rig.seed;
    tc.opt = rig.oc;
    core::trainer local(*ref, rig.m, tc);
    const auto r = split::make_route(true, true, {2, 6, 9, 11}, rig.m.n_blocks());
    rig.host(r);
    for (int s = 0; s < 5; ++s) {
      const float want =
          testing::read(*ref, local.step(rig.data.data() + s * rig.n * 784, rig.labels.data() + s * rig.n, rig.n))[0];
      const auto got = rig.step(r, s, micro_batches);
      CHECK(got.loss == doctest::Approx(want).epsilon(1e-5));
      CHECK(got.n_correct <= static_cast<std::uint32_t>(rig.n));
    }
  }
}

TEST_CASE("moving cuts between steps with weights and optimizer state keeps training equal to local training") {
  struct shape_case {
    bool u, edge;
    std::vector<std::vector<int>> cuts;  // one route per 3 steps, cycled
    core::optimizer_kind opt;
  };
  for (const auto& sc :
       {shape_case{false, false, {{4}, {9}, {1}, {12}, {6}}, core::optimizer_kind::sgd},
        shape_case{false, true, {{3, 7}, {5, 5}, {1, 12}, {8, 10}, {2, 3}}, core::optimizer_kind::adamw},
        shape_case{true, false, {{6, 11}, {1, 2}, {10, 11}, {3, 8}}, core::optimizer_kind::sgd},
        shape_case{
            true, true, {{2, 6, 9, 11}, {1, 1, 11, 11}, {4, 5, 6, 7}, {8, 9, 10, 10}}, core::optimizer_kind::adamw}}) {
    core::optimizer_config oc;
    oc.kind = sc.opt;
    if (sc.opt == core::optimizer_kind::adamw) oc.lr = 0.002f;
    split_rig rig(oc);
    const auto want = rig.local_params();
    auto r = split::make_route(sc.u, sc.edge, sc.cuts[0], rig.m.n_blocks());
    rig.host(r);
    int n_moves = 0;
    for (int s = 0; s < rig.steps; ++s) {
      if (s > 0 && s % 3 == 0) {
        const auto next = split::make_route(sc.u, sc.edge, sc.cuts[(s / 3) % sc.cuts.size()], rig.m.n_blocks());
        CAPTURE(r.str());
        CAPTURE(next.str());
        // Every tier hands over what it loses; the server's share arrives before it re-hosts
        // (as a device's Migrate does before its Cutover), the others' after.
        std::vector<std::pair<core::tier, split::block_state>> moving;
        for (auto t : {core::tier::device, core::tier::edge}) {
          for (auto& st : rig.hosts[t]->rehost(7, r, next, t)) {
            core::tier to = next.path[0];
            for (int seg = 0; seg < next.n_segments(); ++seg)
              if (next.begin(seg) <= st.begin && st.begin < next.end(seg))
                to = next.path[static_cast<std::size_t>(seg)];
            CHECK(to != t);
            moving.emplace_back(to, std::move(st));
          }
        }
        for (auto& [to, st] : moving)
          if (to == core::tier::server) rig.hosts[to]->install_blocks(7, st);
        for (auto& st : rig.hosts[core::tier::server]->rehost(7, r, next, core::tier::server)) {
          core::tier to = core::tier::device;
          for (int seg = 0; seg < next.n_segments(); ++seg)
            if (next.begin(seg) <= st.begin && st.begin < next.end(seg)) to = next.path[static_cast<std::size_t>(seg)];
          moving.emplace_back(to, std::move(st));
        }
        for (auto& [to, st] : moving)
          if (to != core::tier::server) rig.hosts[to]->install_blocks(7, st);
        n_moves += static_cast<int>(moving.size());
        for (auto& [t, h] : rig.hosts) CHECK(h->n_missing(7) == 0);
        r = next;
      }
      rig.step(r, s, 1);
    }
    CHECK(n_moves >= 6);
    const auto got = rig.params(r);
    REQUIRE(got.size() == want.size());
    CHECK(max_rel_diff(got, want) <= 1e-5);
  }
}

TEST_CASE("migrated blocks that do not fit the model or the plan are refused") {
  split_rig rig;
  const auto r1 = split::make_route(false, false, {4}, rig.m.n_blocks());
  const auto r2 = split::make_route(false, false, {8}, rig.m.n_blocks());
  rig.host(r1);
  auto lost = rig.hosts[core::tier::server]->rehost(7, r1, r2, core::tier::server);
  REQUIRE(lost.size() == 1);
  CHECK(lost[0].begin == 4);
  CHECK(lost[0].end == 8);
  auto& dev = *rig.hosts[core::tier::device];
  dev.rehost(7, r1, r2, core::tier::device);
  CHECK(dev.n_missing(7) == 4);
  split::block_state bad = lost[0];
  bad.params.pop_back();
  CHECK(testing::error_of([&] { dev.install_blocks(7, bad); }).find("parameters") != std::string::npos);
  bad = lost[0];
  bad.end = 40;
  CHECK(testing::error_of([&] { dev.install_blocks(7, bad); }).find("outside") != std::string::npos);
  dev.install_blocks(7, lost[0]);
  CHECK(dev.n_missing(7) == 0);
}

TEST_CASE("block averages are weighted by samples and combine associatively") {
  const auto m = core::zoo_model("mlp", shape{4}, 3);
  const auto lay = core::layout_of(m);
  const auto np = lay.param_offset.back();
  const auto a = testing::random_vec(np, 1), b = testing::random_vec(np, 2), c = testing::random_vec(np, 3);
  split::model_average all(m);
  all.add(0, m.n_blocks(), 10, a, {});
  all.add(0, m.n_blocks(), 30, b, {});
  all.add(0, m.n_blocks(), 20, c, {});
  // An edge pre-averages a and b, then the server combines with c.
  split::model_average edge(m), server(m);
  edge.add(0, m.n_blocks(), 10, a, {});
  edge.add(0, m.n_blocks(), 30, b, {});
  for (const auto& run : edge.runs()) {
    std::vector<float> p, s;
    edge.mean(run.first, run.end, p, s);
    server.add(run.first, run.end, run.weight, p, s);
  }
  server.add(0, m.n_blocks(), 20, c, {});
  std::vector<float> p1(static_cast<std::size_t>(np)), s1, p2(static_cast<std::size_t>(np)), s2;
  all.mean_into(p1, s1);
  server.mean_into(p2, s2);
  for (std::int64_t i = 0; i < np; ++i) {
    const auto k = static_cast<std::size_t>(i);
    CHECK(p1[k] == doctest::Approx((10.0 * a[k] + 30.0 * b[k] + 20.0 * c[k]) / 60.0).epsilon(1e-6));
    CHECK(p2[k] == doctest::Approx(p1[k]).epsilon(1e-6));
  }
  // Replicas of part of the model: blocks nobody sent keep their values.
  split::model_average part(m);
  const auto off = lay.param_offset[2];
  part.add(2, m.n_blocks(), 5, std::vector<float>(b.begin() + off, b.end()), {});
  CHECK(!part.covers_all());
  std::vector<float> keep = a, none;
  part.mean_into(keep, none);
  CHECK(keep[0] == a[0]);
  CHECK(keep.back() == doctest::Approx(b.back()));
}

TEST_CASE("bad cuts are refused with the reason") {
  using cleave::testing::error_of;
  CHECK(error_of([] { split::parse_cuts("3;7"); }).find("cuts '3;7': expected comma-separated block indices") == 0);
  CHECK(error_of([] { split::parse_cuts(""); }) == "cuts '': empty");
  CHECK(error_of([] { split::make_route(false, true, {3}, 12); }) == "3-tier plan needs 2 cuts, got 1");
  CHECK(error_of([] { split::make_route(false, false, {13}, 12); }).find("cut 13 out of order or outside [0, 12]") !=
        std::string::npos);
  CHECK(error_of([] { split::make_route(false, true, {7, 3}, 12); }).find("cut 3 out of order") != std::string::npos);
  CHECK(error_of([] {
          split::make_route(false, false, {0}, 12);
        }).find("the device must hold at least the first block (raw inputs never leave it)") != std::string::npos);
  CHECK(error_of([] {
          split::make_route(true, false, {4, 12}, 12);
        }).find("the device must hold at least the last block (labels never leave it)") != std::string::npos);
  CHECK(split::make_route(true, true, {2, 6, 11, 11}, 12).str() ==
        "device[0,2) edge[2,6) server[6,11) edge[11,11) device[11,12)");
}
