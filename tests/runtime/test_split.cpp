// Split training over TLS on loopback equals local training: one device in every plan shape,
// and four devices in SplitFed-v1 against four local trainings averaged.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <set>

#include "cleave/transport/message.h"

#include "cleave/core/model_builder.h"
#include "cleave/core/random.h"
#include "cleave/core/trainer.h"
#include "federation.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

// Trains t for `steps` steps on device `device`'s data stream (partition "all"): position p is
// sample order(p / n)[p % n].
void train_as_device(core::trainer& t, const core::dataset& train, std::uint32_t device, int steps, int batch,
                     const std::function<float(int step)>& lr_of = {}, const core::augment_config& aug = {}) {
  const std::uint64_t order_seed = device::default_order_seed(1, device);
  const std::int64_t n = train.size();
  std::vector<float> x(static_cast<std::size_t>(batch * 784));
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
  std::int64_t pos = 0;
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < batch; ++i, ++pos) {
      const std::int64_t idx = core::epoch_order(n, order_seed, pos / n)[static_cast<std::size_t>(pos % n)];
      train.gather(&idx, 1, x.data() + i * 784, y.data() + i, aug, order_seed, pos / n);
    }
    if (lr_of) t.opt().set_lr(lr_of(s));
    t.step(x.data(), y.data(), batch);
  }
}

std::vector<float> local_training(const workspace& w, const std::string& be, const core::optimizer_config& opt,
                                  std::uint64_t seed, std::uint32_t device, int steps, int batch,
                                  const std::function<float(int step)>& lr_of = {},
                                  const core::augment_config& aug = {}) {
  const auto d = core::load_dataset(w.data.string());
  const auto m = core::zoo_model("lenet5", d.train.item, d.train.n_classes);
  auto b = backend::make_backend(be);
  core::train_config tc;
  tc.seed = seed;
  tc.opt = opt;
  core::trainer t(*b, m, tc);
  train_as_device(t, d.train, device, steps, batch, lr_of, aug);
  std::vector<float> p(static_cast<std::size_t>(t.model_stage().n_params()));
  b->download(t.model_stage().params(), p.data());
  return p;
}

// One round of sequential split learning, trained locally: devices 1..n take turns, each from the
// global weights for its own (and its edge's) blocks and from the server's blocks [first, end) as
// the turn before left them, optimizer state included. The result: the mean of the devices'
// blocks outside [first, end), and the server's after the last turn.
std::vector<float> sequential_training(const workspace& w, const std::string& be, const core::optimizer_config& opt,
                                       std::uint64_t seed, int n_devices, int steps, int batch, int first, int end) {
  const auto d = core::load_dataset(w.data.string());
  const auto m = core::zoo_model("lenet5", d.train.item, d.train.n_classes);
  const auto lay = core::layout_of(m);
  const auto s0 = static_cast<std::size_t>(lay.param_offset[static_cast<std::size_t>(first)]);
  const auto s1 = static_cast<std::size_t>(lay.param_offset[static_cast<std::size_t>(end)]);
  auto b = backend::make_backend(be);
  core::train_config tc;
  tc.seed = seed;
  tc.opt = opt;
  std::vector<float> global, buffers;
  core::initial_values(m, 0, m.n_blocks(), seed, global, buffers);
  REQUIRE(buffers.empty());
  std::vector<float> server(global), momentum(global.size(), 0.0f), mean(global.size(), 0.0f);
  for (int dev = 1; dev <= n_devices; ++dev) {
    core::trainer t(*b, m, tc);
    std::vector<float> p(global), mo(global.size(), 0.0f);
    std::copy(server.begin() + s0, server.begin() + s1, p.begin() + s0);
    std::copy(momentum.begin() + s0, momentum.begin() + s1, mo.begin() + s0);
    b->upload(t.model_stage().params(), p.data());
    REQUIRE(t.opt().state().size() == 1);  // sgd's momentum
    b->upload(t.opt().state()[0], mo.data());
    train_as_device(t, d.train, static_cast<std::uint32_t>(dev), steps, batch);
    b->download(t.model_stage().params(), p.data());
    b->download(t.opt().state()[0], mo.data());
    for (std::size_t i = 0; i < p.size(); ++i) mean[i] += p[i] / static_cast<float>(n_devices);
    server = p;
    momentum = mo;
  }
  std::copy(server.begin() + s0, server.begin() + s1, mean.begin() + s0);
  return mean;
}

struct plan_shape {
  const char* name;
  bool edge, u_shape;
};

// Runs a federation of n devices (all behind one edge when `edge`) and returns the server's
// global parameters after its rounds.
std::vector<float> run_federation(const workspace& w, const std::string& be, server::server_config sc, int n_devices,
                                  bool edge, const std::function<void(device::agent_config&)>& customise,
                                  const std::function<void(edge::edge_config&)>& customise_edge = {}) {
  std::promise<std::uint16_t> port;
  sc.on_listening = [&](std::uint16_t p) { port.set_value(p); };
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  const std::uint16_t sp = port.get_future().get();
  test_edge en;
  std::uint16_t up = sp;
  std::string up_name = "server";
  if (edge) {
    up = (en = start_edge(w, be, sp, customise_edge)).port;
    up_name = "edge-1";
  }
  std::vector<std::unique_ptr<device::agent>> agents;
  std::vector<std::unique_ptr<runner>> ra;
  for (int i = 1; i <= n_devices; ++i) {
    auto ac = agent_cfg(w, static_cast<std::uint32_t>(i), up, be, up_name);
    if (customise) customise(ac);
    agents.push_back(std::make_unique<device::agent>(ac));
    ra.push_back(std::make_unique<runner>([a = agents.back().get()] { a->run(); }));
  }
  rs.join();
  for (auto& r : ra) r->join();
  if (en.thread) en.thread->join();
  CHECK(rs.error() == "");
  for (auto& r : ra) CHECK(r->error() == "");
  if (en.thread) CHECK(en.thread->error() == "");
  return srv.global_params();
}

// Runs one device against a server of its own until the device stops, then stops the server;
// returns the device's error ("" when it finished).
std::string run_one_device(const workspace& w, const std::string& be, server::server_config sc,
                           const std::function<void(device::agent_config&)>& customise) {
  std::promise<std::uint16_t> port;
  sc.on_listening = [&](std::uint16_t p) { port.set_value(p); };
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  auto ac = agent_cfg(w, 1, port.get_future().get(), be, "server");
  if (customise) customise(ac);
  device::agent a(ac);
  std::string error;
  try {
    a.run();
  } catch (const std::exception& e) {
    error = e.what();
  }
  srv.stop();
  rs.join();
  return error;
}

}  // namespace

TEST_CASE("split training with one device equals local training in 2-tier, 3-tier and U-shaped plans") {
  const std::string be = test_backend();
  for (const plan_shape& ps : {plan_shape{"2-tier", false, false}, plan_shape{"3-tier", true, false},
                               plan_shape{"U-shaped 2-tier", false, true}, plan_shape{"U-shaped 3-tier", true, true}}) {
    SUBCASE(ps.name) {
      workspace w(std::string("equiv-") + (ps.edge ? "e" : "") + (ps.u_shape ? "u" : ""), 1);
      auto sc = server_cfg(w, be);
      sc.rounds = 2;
      sc.local_steps = 25;
      sc.u_shape = ps.u_shape;
      const auto got = run_federation(w, be, sc, 1, ps.edge, {});
      const auto want = local_training(w, be, sc.opt, sc.seed, 1, 50, sc.batch);
      const double diff = max_rel_diff(got, want);
      INFO(std::string(ps.name) << ": max relative difference " << diff);
      CHECK(diff <= 1e-5);
    }
  }
}

TEST_CASE("a device holding every block computes its loss itself, and the round counts it") {
  const std::string be = test_backend();
  for (const bool edge : {false, true}) {
    SUBCASE(edge ? "behind an edge" : "straight to the server") {
      workspace w(std::string("devonly") + (edge ? "-e" : ""), 1);
      auto sc = server_cfg(w, be);
      sc.rounds = 2;
      sc.local_steps = 25;
      sc.cuts = {12};
      sc.edge_cuts = {12, 12};
      std::vector<server::round_report> reports;
      sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
      const auto got = run_federation(w, be, sc, 1, edge, {});
      const auto want = local_training(w, be, sc.opt, sc.seed, 1, 50, sc.batch);
      const double diff = max_rel_diff(got, want);
      INFO("max relative difference " << diff);
      CHECK(diff <= 1e-5);
      REQUIRE(reports.size() == 2);
      for (const auto& r : reports) {
        INFO("round " << r.round << ": train loss " << r.train_loss << ", accuracy " << r.train_accuracy);
        CHECK(r.routes.at(0).second ==
              (edge ? "device[0,12) edge[12,12) server[12,12)" : "device[0,12) server[12,12)"));
        // The device's 25 steps, counted from its statistics: nothing ran above it.
        CHECK(r.train_loss > 0.05);
        CHECK(r.train_loss < 2.5);
        CHECK(r.train_accuracy > 0.3);
        CHECK(r.server_compute_s == 0.0);
        CHECK(r.edge_compute_s == 0.0);
      }
      CHECK(reports[1].train_loss < reports[0].train_loss);
    }
  }
}

TEST_CASE("a device augmenting its batches trains as local training on the same augmented samples") {
  const std::string be = test_backend();
  workspace w("augment", 1);
  auto sc = server_cfg(w, be);
  sc.rounds = 2;
  sc.local_steps = 25;
  const core::augment_config aug{true, 4, true};
  const auto got = run_federation(w, be, sc, 1, false, [&](device::agent_config& ac) { ac.augment = aug; });
  const auto want = local_training(w, be, sc.opt, sc.seed, 1, 50, sc.batch, {}, aug);
  const auto plain = local_training(w, be, sc.opt, sc.seed, 1, 50, sc.batch);
  const double diff = max_rel_diff(got, want);
  INFO("max relative difference " << diff);
  CHECK(diff <= 1e-5);
  CHECK(max_rel_diff(got, plain) > 1e-3);  // the augmentation took effect
}

TEST_CASE("a device on the vulkan backend trains its blocks in a split as local training does") {
  const auto known = backend::list_backends();
  if (std::none_of(known.begin(), known.end(), [](const auto& b) { return b.name == "vulkan" && b.available; })) {
    MESSAGE("no Vulkan device here: nothing to run");
    return;
  }
  const std::string be = test_backend();
  for (const plan_shape& ps : {plan_shape{"2-tier", false, false}, plan_shape{"U-shaped 2-tier", false, true}}) {
    SUBCASE(ps.name) {
      workspace w(std::string("vulkan-") + (ps.u_shape ? "u" : ""), 1);
      auto sc = server_cfg(w, be);
      sc.rounds = 1;
      sc.local_steps = 12;
      sc.u_shape = ps.u_shape;
      const auto got = run_federation(w, be, sc, 1, false, [](device::agent_config& a) { a.backend = "vulkan"; });
      const auto want = local_training(w, be, sc.opt, sc.seed, 1, sc.local_steps, sc.batch);
      const double diff = max_rel_diff(got, want);
      // Blocks on vulkan and on the CPU round differently; after 12 steps they still agree
      // to about 1e-5.
      INFO(std::string(ps.name) << ": max relative difference to local training on " << be << ": " << diff);
      CHECK(diff <= 1e-4);
    }
  }
}

TEST_CASE("a per-round learning-rate schedule reaches every tier: split training equals local training") {
  const std::string be = test_backend();
  for (const plan_shape& ps : {plan_shape{"3-tier", true, false}, plan_shape{"U-shaped 3-tier", true, true}}) {
    SUBCASE(ps.name) {
      workspace w(std::string("lrs-") + (ps.u_shape ? "u" : ""), 1);
      auto sc = server_cfg(w, be);
      sc.rounds = 4;
      sc.local_steps = 6;
      sc.u_shape = ps.u_shape;
      sc.lr_schedule = core::schedule_kind::cosine;
      sc.warmup_rounds = 1;
      std::vector<double> lrs;
      sc.on_round = [&](const server::round_report& r) { lrs.push_back(r.learning_rate); };
      const auto got = run_federation(w, be, sc, 1, ps.edge, {});
      // Round r (1-based): warm-up to sc.opt.lr in round 1, then cosine over rounds 2..4.
      auto lr_of_round = [&](int r) {
        core::optimizer_config s = sc.opt;
        s.schedule = core::schedule_kind::cosine;
        s.total_steps = sc.rounds;
        s.warmup_steps = 1;
        return core::learning_rate(s, r - 1);
      };
      REQUIRE(lrs.size() == 4);
      for (int r = 1; r <= 4; ++r) CHECK(lrs[static_cast<std::size_t>(r - 1)] == doctest::Approx(lr_of_round(r)));
      CHECK(lrs[1] > lrs[2]);
      CHECK(lrs[2] > lrs[3]);
      const auto want = local_training(w, be, sc.opt, sc.seed, 1, sc.rounds * sc.local_steps, sc.batch,
                                       [&](int step) { return lr_of_round(step / sc.local_steps + 1); });
      const double diff = max_rel_diff(got, want);
      INFO(std::string(ps.name) << ": max relative difference " << diff);
      CHECK(diff <= 1e-5);
      // The schedule matters: a constant rate ends elsewhere.
      const auto flat = local_training(w, be, sc.opt, sc.seed, 1, sc.rounds * sc.local_steps, sc.batch);
      CHECK(max_rel_diff(got, flat) > 1e-3);
    }
  }
}

// Valid cuts of a route shape over n blocks, drawn from r.
std::vector<int> random_cuts(core::rng& r, bool u_shape, bool edge, int n) {
  const std::size_t k = (edge ? 2 : 1) * (u_shape ? 2 : 1);
  for (;;) {
    std::vector<int> c(k);
    for (auto& v : c) v = static_cast<int>(r.below(static_cast<std::uint64_t>(n + 1)));
    std::sort(c.begin(), c.end());
    if (c.front() >= 1 && (!u_shape || c.back() <= n - 1)) return c;
  }
}

TEST_CASE("forced re-splits every few steps end with the same parameters as a fixed plan") {
  const std::string be = test_backend();
  for (const plan_shape& ps : {plan_shape{"2-tier", false, false}, plan_shape{"3-tier", true, false},
                               plan_shape{"U-shaped 2-tier", false, true}, plan_shape{"U-shaped 3-tier", true, true}}) {
    SUBCASE(ps.name) {
      workspace w(std::string("resplit-") + (ps.edge ? "e" : "") + (ps.u_shape ? "u" : ""), 1);
      auto sc = server_cfg(w, be);
      sc.rounds = 2;
      sc.local_steps = 25;
      sc.u_shape = ps.u_shape;
      if (ps.edge) {  // AdamW: two state tensors and a step count move with the blocks
        sc.opt.kind = core::optimizer_kind::adamw;
        sc.opt.lr = 0.002f;
      }
      std::mutex mu;
      core::rng draw(5);
      std::optional<split::route> seen;
      int n_switches = 0;
      sc.force_route = [&](std::uint32_t, std::uint64_t step,
                           const split::route& current) -> std::optional<split::route> {
        std::lock_guard lock(mu);
        if (seen && !(*seen == current)) ++n_switches;
        seen = current;
        if (step % 4 != 0) return std::nullopt;
        return split::make_route(ps.u_shape, ps.edge, random_cuts(draw, ps.u_shape, ps.edge, 12), 12);
      };
      const auto got = run_federation(w, be, sc, 1, ps.edge, {});
      const auto want = local_training(w, be, sc.opt, sc.seed, 1, 50, sc.batch);
      const double diff = max_rel_diff(got, want);
      INFO(std::string(ps.name) << ": " << n_switches << " re-splits, max relative difference " << diff);
      CHECK(n_switches >= 6);
      CHECK(diff <= 1e-5);
    }
  }
}

TEST_CASE("three devices re-split independently in one SplitFed round and still average exactly") {
  const std::string be = test_backend();
  // Also under a rule that has the edge forward each device's replicas: a trimmed mean that
  // trims nothing, of replicas of equal weight, is the same average.
  for (const char* rule : {"mean", "trimmed-mean:0"}) {
    SUBCASE(rule) {
      workspace w("resplit3", 3);
      auto sc = server_cfg(w, be);
      sc.rounds = 1;
      sc.local_steps = 12;
      sc.min_devices = 3;
      sc.aggregate = split::parse_aggregate(rule);
      std::mutex mu;
      core::rng draw(9);
      sc.force_route = [&](std::uint32_t dev, std::uint64_t step, const split::route&) -> std::optional<split::route> {
        std::lock_guard lock(mu);
        if ((step + dev) % 3 != 0) return std::nullopt;
        return split::make_route(false, true, random_cuts(draw, false, true, 12), 12);
      };
      int n_resplits = 0;
      sc.on_round = [&](const server::round_report& r) { n_resplits += r.n_resplits; };
      const auto got = run_federation(w, be, sc, 3, true, {});
      std::vector<double> mean(got.size(), 0.0);
      for (std::uint32_t d = 1; d <= 3; ++d) {
        const auto p = local_training(w, be, sc.opt, sc.seed, d, 12, sc.batch);
        for (std::size_t i = 0; i < p.size(); ++i) mean[i] += p[i] / 3.0;
      }
      const double diff = max_rel_diff(got, std::vector<float>(mean.begin(), mean.end()));
      INFO(std::string(rule) << ": " << n_resplits << " re-splits, max relative difference " << diff);
      CHECK(n_resplits >= 3);
      CHECK(diff <= 1e-5);
    }
  }
}

TEST_CASE("the adaptive splitter moves a slowed device's blocks to the server") {
  const std::string be = test_backend();
  workspace w("adapt", 2);
  auto sc = server_cfg(w, be);
  sc.adaptive = true;
  sc.rounds = 3;
  sc.local_steps = 12;
  sc.min_devices = 2;
  sc.cuts = {6};
  sc.run_log = w.dir / "rounds.jsonl";
  std::vector<server::round_report> reports;
  sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
  run_federation(w, be, sc, 2, false, [](device::agent_config& a) {
    a.profile_every = 4;
    // A board far slower than the server: the choice holds however loaded this machine is.
    if (a.id == 2) a.slowdown = 40;
  });
  {
    // Each device's predicted step is priced with the others sharing the server, as the round's
    // is: the slowest of them is the round's.
    std::ifstream log(sc.run_log);
    std::string line, last;
    while (std::getline(log, line)) last = line;
    const auto j = nlohmann::json::parse(last);
    double most = 0;
    for (const auto& d : j["routes"]) {
      CHECK(d["predicted_step_seconds"].get<double>() > 0);
      most = std::max(most, d["predicted_step_seconds"].get<double>());
    }
    CHECK(most == doctest::Approx(j["predicted_step_seconds"].get<double>()).epsilon(1e-9));
  }
  REQUIRE(reports.size() == 3);
  int n_resplits = 0;
  for (const auto& r : reports) n_resplits += r.n_resplits;
  CHECK(n_resplits >= 1);
  CHECK(reports.back().predicted_step_seconds > 0);
  REQUIRE(reports.back().routes.size() == 2);
  // device[0,c) server[c,12): the slow device keeps fewer blocks than the fast one.
  auto cut_of = [](const std::string& route) { return std::stoi(route.substr(route.find(',') + 1)); };
  const int fast = cut_of(reports.back().routes[0].second), slow = cut_of(reports.back().routes[1].second);
  INFO("fast device: " << reports.back().routes[0].second << ", slow device: " << reports.back().routes[1].second);
  CHECK(slow < fast);
}

TEST_CASE(
    "a schedule slows an edge and the server as it does an agent, and the splitter moves blocks off a slow edge") {
  const std::string be = test_backend();
  // The blocks on the edge after three adaptive rounds of one device behind it, under `schedule`.
  auto edge_blocks = [&](const std::string& schedule) {
    workspace w("slow-edge", 1);
    auto sc = server_cfg(w, be);
    sc.adaptive = true;
    sc.rounds = 3;
    sc.local_steps = 12;
    sc.edge_cuts = {3, 8};
    sc.schedule = cleave::transport::parse_schedule(schedule);
    std::vector<server::round_report> reports;
    sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
    run_federation(
        w, be, sc, 1, true,
        [&](device::agent_config& a) {
          a.profile_every = 4;
          a.slowdown = 40;  // a board: its blocks go up
          a.schedule = cleave::transport::parse_schedule(schedule);
        },
        [&](edge::edge_config& ec) { ec.schedule = cleave::transport::parse_schedule(schedule); });
    REQUIRE(reports.size() == 3);
    REQUIRE(reports.back().routes.size() == 1);
    const std::string route = reports.back().routes[0].second;
    MESSAGE("under '" << schedule << "': " << route);
    const auto at = route.find("edge[");
    if (at == std::string::npos) return 0;
    return std::stoi(route.substr(route.find(',', at) + 1)) - std::stoi(route.substr(at + 5));
  };
  CHECK(edge_blocks("at 1 slowdown edge-1 200") < edge_blocks("at 1 slowdown server 200"));
  // Their compute, as the rounds report it.
  for (const bool edge : {false, true}) {
    CAPTURE(edge);
    workspace w(edge ? "slow-edge-2" : "slow-server-2", 1);
    auto sc = server_cfg(w, be);
    sc.rounds = 2;
    sc.local_steps = 12;
    sc.edge_cuts = {3, 8};
    const std::string schedule = edge ? "at 2 slowdown edge-1 20" : "at 2 slowdown server 20";
    sc.schedule = cleave::transport::parse_schedule(schedule);
    std::vector<server::round_report> reports;
    sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
    run_federation(w, be, sc, 1, edge, {},
                   [&](edge::edge_config& ec) { ec.schedule = cleave::transport::parse_schedule(schedule); });
    REQUIRE(reports.size() == 2);
    const auto compute = [edge](const server::round_report& r) { return edge ? r.edge_compute_s : r.server_compute_s; };
    INFO("compute " << compute(reports[0]) << " s, then " << compute(reports[1]) << " s");
    CHECK(compute(reports[1]) > 4 * compute(reports[0]));
  }
}

TEST_CASE("a round with a re-split is predicted under the plan each of its steps ran") {
  const std::string be = test_backend();
  workspace w("legs", 1);
  auto sc = server_cfg(w, be);
  sc.adaptive = true;
  sc.min_gain = 1.0;  // the splitter keeps every plan: only the forced re-split moves blocks
  sc.rounds = 3;
  sc.local_steps = 12;
  sc.cuts = {11};  // every block but the last on the board
  std::vector<server::round_report> reports;
  sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
  // Halfway through round 2 the board keeps conv1 only, the server the rest.
  const auto moved = split::make_route(false, false, {1}, 12);
  sc.force_route = [&](std::uint32_t, std::uint64_t step, const split::route& current) -> std::optional<split::route> {
    if (step == 2 * 12 + 6 && !(current == moved)) return moved;
    return std::nullopt;
  };
  run_federation(w, be, sc, 1, false, [](device::agent_config& a) {
    a.profile_every = 4;
    a.slowdown = 100;  // the board's blocks cost far more than the server's, however loaded
  });
  REQUIRE(reports.size() == 3);
  CHECK(reports[1].n_resplits == 1);
  CHECK(reports[1].routes.at(0).second == moved.str());
  const double on_board = reports[0].predicted_step_seconds, half = reports[1].predicted_step_seconds,
               split_ = reports[2].predicted_step_seconds;
  INFO("predicted steps: round 1 " << on_board << " s, round 2 " << half << " s, round 3 " << split_ << " s");
  REQUIRE(split_ > 0);
  // Round 2 is priced leg by leg in one snapshot of the profiles: the first plan for the steps
  // that ran it (the re-split is forced at step 6 and cut over at the next), then the new one.
  // (Predictions of different rounds rest on different profiles, which a loaded machine moves
  // by a quarter or more, so they are not compared with each other.)
  const auto& legs = reports[1].legs;
  REQUIRE(legs.size() == 2);
  CHECK(legs[0].device == 1);
  CHECK(legs[0].route == split::make_route(false, false, {11}, 12).str());
  CHECK(legs[1].route == moved.str());
  CHECK(legs[0].steps >= 6);
  CHECK(legs[0].steps <= 8);
  CHECK(legs[0].steps + legs[1].steps == 12);
  CHECK(legs[0].migration_seconds > 0);
  CHECK(legs[1].migration_seconds == 0);
  // The board keeps conv1 alone: blocks 1-10 leave a board 100x slower than the server.
  CHECK(legs[1].step_seconds < legs[0].step_seconds);
  const double mix = (static_cast<double>(legs[0].steps) * legs[0].step_seconds + legs[0].migration_seconds +
                      static_cast<double>(legs[1].steps) * legs[1].step_seconds) /
                     12.0;
  CHECK(half == doctest::Approx(mix).epsilon(1e-9));
  // Not the price of the plan in force at the round's end alone.
  CHECK(half > legs[1].step_seconds);
  // Rounds without a re-split have no legs.
  CHECK(reports[0].legs.empty());
  CHECK(reports[2].legs.empty());
  CHECK(on_board > 0);
}

TEST_CASE("a device moving between plans does not hold back the re-split of another") {
  const std::string be = test_backend();
  workspace w("held", 2);
  auto sc = server_cfg(w, be);
  sc.adaptive = true;
  sc.rounds = 3;
  sc.local_steps = 12;
  sc.min_devices = 2;
  // U-shaped, so that every route sends steps to the server (device 1's are where it is forced).
  sc.u_shape = true;
  sc.cuts = {11, 11};  // every block but the head on the boards, the server relays
  // From round 2 device 2 is far slower than the server: its blocks belong there. Device 1's
  // link is paced, so its measured figure holds still (a moved one would be reported at once).
  const std::string schedule = "at 1 link device-1 * 100Mbit/s; at 2 slowdown device-2 40";
  sc.schedule = cleave::transport::parse_schedule(schedule);
  // Device 1 is re-split at every step: it always has a re-split announced or not yet measured.
  std::mutex mu;
  int n_forced = 0;
  sc.force_route = [&](std::uint32_t dev, std::uint64_t, const split::route& current) -> std::optional<split::route> {
    if (dev != 1) return std::nullopt;
    std::lock_guard lock(mu);
    ++n_forced;
    return split::make_route(true, false, {current.end(0) == 6 ? 8 : 6, 11}, 12);
  };
  std::vector<server::round_report> reports;
  sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
  run_federation(w, be, sc, 2, false, [&](device::agent_config& a) {
    a.profile_every = a.id == 1 ? 1000 : 4;
    a.schedule = cleave::transport::parse_schedule(schedule);
  });
  REQUIRE(reports.size() == 3);
  REQUIRE(reports.back().routes.size() == 2);
  INFO(n_forced << " forced re-splits of device 1; device 2 ends on " << reports.back().routes[1].second);
  CHECK(n_forced >= 6);
  const auto& slow = reports.back().routes[1].second;
  CHECK(std::stoi(slow.substr(slow.find(',') + 1)) < 11);  // its bottom cut
}

TEST_CASE("a device whose link slows mid-round reports it at once, and the splitter re-splits within that round") {
  const std::string be = test_backend();
  workspace w("linkdrop", 1);
  auto sc = server_cfg(w, be);
  sc.adaptive = true;
  sc.rounds = 2;
  sc.local_steps = 30;
  sc.batch = 32;
  // From round 2 the link carries 1 MB/s: every cut's activations then cost the slowed board more
  // than running the blocks itself.
  const std::string schedule = "at 2 link * * 8Mbit/s";
  sc.schedule = cleave::transport::parse_schedule(schedule);
  std::vector<server::round_report> reports;
  sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
  // A board 40x slower: on loopback a split is then clearly faster than the board alone. At 10x
  // the two were within 2x of each other, and a re-plan at the end of round 1 could still be
  // announced, not yet taken, when the round's routes were reported.
  run_federation(w, be, sc, 1, false, [&](device::agent_config& a) {
    a.slowdown = 40;
    a.schedule = cleave::transport::parse_schedule(schedule);
    a.profile_every = 1000;  // no periodic profile within a round: only the link's change sends one
  });
  REQUIRE(reports.size() == 2);
  INFO("round 1: " << reports[0].routes.at(0).second << ", round 2: " << reports[1].routes.at(0).second);
  // Round 1 on loopback: the board keeps few blocks. Round 2: re-split while it ran.
  CHECK(reports[0].routes.at(0).second != "device[0,12) server[12,12)");
  CHECK(reports[1].n_resplits >= 1);
}

TEST_CASE("a SplitFed-v1 round of four devices equals four local trainings averaged") {
  const std::string be = test_backend();
  workspace w("avg4", 4);
  auto sc = server_cfg(w, be);
  sc.rounds = 1;
  sc.local_steps = 10;
  sc.min_devices = 4;
  const auto got = run_federation(w, be, sc, 4, true, {});
  std::vector<double> mean(got.size(), 0.0);
  for (std::uint32_t d = 1; d <= 4; ++d) {
    const auto p = local_training(w, be, sc.opt, sc.seed, d, 10, sc.batch);
    for (std::size_t i = 0; i < p.size(); ++i) mean[i] += p[i] / 4.0;
  }
  const double diff = max_rel_diff(got, std::vector<float>(mean.begin(), mean.end()));
  INFO("max relative difference " << diff);
  CHECK(diff <= 1e-5);
}

TEST_CASE(
    "sequential mode: devices take turns on one server replica, directly and behind an edge, as trained locally") {
  const std::string be = test_backend();
  struct shape {
    const char* name;
    bool edge, u_shape;
    std::vector<int> cuts;
    int first, end;  // the server's blocks
  };
  for (const shape& ps : {shape{"2-tier", false, false, {5}, 5, 12}, shape{"3-tier", true, false, {3, 8}, 8, 12},
                          shape{"U-shaped 2-tier", false, true, {4, 10}, 4, 10}}) {
    SUBCASE(ps.name) {
      workspace w(std::string("seq-") + (ps.edge ? "e" : "") + (ps.u_shape ? "u" : ""), 3);
      auto sc = server_cfg(w, be);
      sc.mode = server::training_mode::sequential;
      sc.rounds = 1;
      sc.local_steps = 8;
      sc.min_devices = 3;
      sc.u_shape = ps.u_shape;
      (ps.edge ? sc.edge_cuts : sc.cuts) = ps.cuts;
      std::vector<server::round_report> reports;
      sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
      const auto t0 = std::chrono::steady_clock::now();
      const auto got = run_federation(w, be, sc, 3, ps.edge, {});
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      REQUIRE(reports.size() == 1);
      CHECK(reports[0].n_devices == 3);
      CHECK(secs < sc.round_deadline_s / 2);  // every turn ended when its device finished
      const auto want = sequential_training(w, be, sc.opt, sc.seed, 3, 8, sc.batch, ps.first, ps.end);
      const double diff = max_rel_diff(got, want);
      INFO(ps.name << ": max relative difference " << diff);
      CHECK(diff <= 1e-5);
    }
  }
}

TEST_CASE("sequential mode: a device that stalls in its turn is counted out when its share of the deadline ends") {
  const std::string be = test_backend();
  for (const bool edge : {false, true}) {
    CAPTURE(edge);
    workspace w(edge ? "seq-stall-e" : "seq-stall", 3);
    auto sc = server_cfg(w, be);
    sc.mode = server::training_mode::sequential;
    sc.rounds = 2;
    sc.local_steps = 8;
    sc.min_devices = 3;
    sc.round_deadline_s = 6;  // a turn of 2 s each, or more for the later ones when the earlier end early
    std::vector<server::round_report> reports;
    sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
    log_capture logs;
    run_federation(w, be, sc, 3, edge, [](device::agent_config& a) {
      if (a.id == 1) a.slowdown = 2000;  // first in turn, and far too slow for 8 steps in 2 s
    });
    REQUIRE(reports.size() == 2);
    for (const auto& r : reports) {
      CHECK(r.n_participants == 3);
      CHECK(r.n_devices == 2);  // devices 2 and 3 had their turns
      CHECK(r.seconds < sc.round_deadline_s);
    }
    CHECK(logs.count({"device 1 did not finish its turn of 2.0 s; counted out, the next turn starts"}) == 2);
    CHECK(logs.count({"2 of 3 devices finished (the others left or overran their turns)"}) == 2);
  }
}

// A data set behind the data_source interface only (not a core::dataset): what an app's own
// source looks like to the nodes.
class forwarding_source final : public core::data_source {
 public:
  explicit forwarding_source(core::dataset d) : d_(std::move(d)) {}
  std::int64_t size() const override { return d_.size(); }
  core::shape sample_shape() const override { return d_.item; }
  int class_count() const override { return d_.n_classes; }
  std::vector<std::int32_t> labels() const override { return d_.y; }
  void fetch(const std::int64_t* idx, std::int64_t n, float* x, std::int32_t* y) const override {
    d_.gather(idx, n, x, y);
  }
  std::string describe() const override { return "forwarded " + d_.name; }

 private:
  core::dataset d_;
};

TEST_CASE("devices and a server fed by an app's data sources and a built model train as from the files") {
  const std::string be = test_backend();
  workspace w("sources", 2);
  auto sc = server_cfg(w, be);
  sc.rounds = 2;
  sc.local_steps = 6;
  sc.min_devices = 2;
  auto shards = [](device::agent_config& a) {
    a.n_shards = 2;
    a.shard = static_cast<int>(a.id) - 1;
    a.partition = cleave::core::parse_partition("dirichlet:0.5");
  };
  const auto from_files = run_federation(w, be, sc, 2, true, shards);
  auto data = core::load_dataset(w.data.string());
  const auto train = std::make_shared<forwarding_source>(data.train);
  sc.test_source = std::make_shared<forwarding_source>(data.test);
  // lenet5 as the zoo writes it, in C++.
  core::model_builder mb("lenet5", data.train.item, data.train.n_classes);
  mb.conv2d(6, 5, 1, 2).relu().maxpool2d(2).conv2d(16, 5).relu().maxpool2d(2).flatten();
  mb.linear(120).relu().linear(84).relu().linear(data.train.n_classes);
  sc.model_spec = mb.build();
  sc.data = "/nonexistent";  // read by nobody now
  std::vector<server::round_report> reports;
  sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
  const auto from_sources = run_federation(w, be, sc, 2, true, [&](device::agent_config& a) {
    shards(a);
    a.source = train;
    a.data = "/nonexistent";
  });
  REQUIRE(reports.size() == 2);
  CHECK(reports.back().test_samples == data.test.size());
  CHECK(from_sources == from_files);
}

TEST_CASE("in U-shaped plans no message leaving a device holds labels or raw inputs") {
  const std::string be = test_backend();
  for (const plan_shape& ps : {plan_shape{"U-shaped 2-tier", false, true}, plan_shape{"U-shaped 3-tier", true, true}}) {
    SUBCASE(ps.name) {
      workspace w(std::string("privacy-") + (ps.edge ? "e" : ""), 1);
      auto sc = server_cfg(w, be);
      sc.rounds = 1;
      sc.local_steps = 8;
      sc.u_shape = true;
      sent_frames frames;
      run_federation(w, be, sc, 1, ps.edge, [&](device::agent_config& a) { a.on_send = frames.recorder(); });
      // Every training image, as normalised on the device.
      const auto d = core::load_dataset(w.data.string());
      std::set<std::vector<float>> images;
      std::vector<float> x(784);
      std::int32_t y = 0;
      for (std::int64_t i = 0; i < d.train.size(); ++i) {
        d.train.gather(&i, 1, x.data(), &y);
        images.insert(x);
      }
      int n_activations = 0, n_tensors = 0;
      for (const auto& f : frames.all()) {
        auto buf = transport::aligned_bytes::allocate(f.size());
        std::memcpy(buf.data(), f.data(), f.size());
        auto m = transport::decode_frame(std::move(buf), transport::frame_limits{});
        REQUIRE(m.ok());
        if (const auto* a = m->as<cleave::wire::Activations>()) {
          ++n_activations;
          CHECK(a->labels() == nullptr);
        }
        std::vector<const cleave::wire::Tensor*> tensors;
        if (const auto* a = m->as<cleave::wire::Activations>()) tensors.push_back(a->activation());
        if (const auto* g = m->as<cleave::wire::Gradients>()) tensors.push_back(g->gradient());
        if (const auto* r = m->as<cleave::wire::ReplicaUpload>(); r && r->weights())
          for (const auto* t : *r->weights()) tensors.push_back(t);
        for (const auto* t : tensors) {
          const auto v = transport::view_of(*t);
          ++n_tensors;
          CHECK(v.dtype != core::dtype::i32);  // labels are i32
          CHECK(v.dtype != core::dtype::u8);   // raw pixels are u8
          if (v.dtype != core::dtype::f32) continue;
          const auto vals = v.values<float>();
          for (std::size_t at = 0; at + 784 <= vals.size(); at += 784)
            CHECK(images.count(std::vector<float>(vals.begin() + static_cast<std::ptrdiff_t>(at),
                                                  vals.begin() + static_cast<std::ptrdiff_t>(at + 784))) == 0);
        }
      }
      CHECK(n_activations == 8);
      CHECK(n_tensors > 8);
    }
  }
}

namespace {

// The frame as a message (the frames a device sent, seen by its on_send hook).
transport::result<transport::message> decoded(const std::vector<std::byte>& f) {
  auto buf = transport::aligned_bytes::allocate(f.size());
  std::memcpy(buf.data(), f.data(), f.size());
  return transport::decode_frame(std::move(buf), transport::frame_limits{});
}

}  // namespace

TEST_CASE("under secure aggregation four devices average exactly and no device block leaves a device in the clear") {
  const std::string be = test_backend();
  for (bool edge : {false, true}) {
    SUBCASE(edge ? "behind an edge" : "straight to the server") {
      workspace w(edge ? "secagg-e" : "secagg", 4);
      auto sc = server_cfg(w, be);
      sc.rounds = 1;
      sc.local_steps = 10;
      sc.min_devices = 4;
      sc.secure_aggregation = true;
      sent_frames frames;
      const auto got = run_federation(w, be, sc, 4, edge, [&](device::agent_config& a) {
        a.secure_aggregation = true;
        a.on_send = frames.recorder();
      });
      std::vector<double> mean(got.size(), 0.0);
      for (std::uint32_t d = 1; d <= 4; ++d) {
        const auto p = local_training(w, be, sc.opt, sc.seed, d, 10, sc.batch);
        for (std::size_t i = 0; i < p.size(); ++i) mean[i] += p[i] / 4.0;
      }
      const double diff = max_rel_diff(got, std::vector<float>(mean.begin(), mean.end()));
      INFO("max relative difference " << diff);
      CHECK(diff <= 1e-5);
      int n_uploads = 0, n_masked = 0;
      for (const auto& f : frames.all()) {
        auto m = decoded(f);
        REQUIRE(m.ok());
        if (const auto* r = m->as<cleave::wire::ReplicaUpload>()) {
          ++n_uploads;
          CHECK(r->first_block() == r->end_block());
          CHECK((r->weights() == nullptr || r->weights()->size() == 0));
        }
        if (const auto* s = m->as<cleave::wire::SecAgg>(); s && s->phase() == cleave::wire::SecAggPhase::masked)
          ++n_masked;
      }
      CHECK(n_uploads == 4);
      CHECK(n_masked == 4);
    }
  }
}

namespace {

// A server of n devices aggregating securely, rounds of 6 steps, blocks [0, 4) on the devices.
server::server_config secure_cfg(const workspace& w, const std::string& be, int n, int rounds) {
  auto sc = server_cfg(w, be);
  sc.rounds = rounds;
  sc.local_steps = 6;
  sc.min_devices = n;
  sc.cuts = {4};
  sc.secure_aggregation = true;
  return sc;
}

}  // namespace

TEST_CASE("under secure aggregation a block held on fewer devices than --secagg-min-holders is never decoded") {
  // Devices 1 and 2 keep blocks [0, 4) on the board; device 3 is moved to [0, 8) in its first
  // step. Blocks 4-7 are then on one device only: their secure sum would be device 3's replica.
  const std::string be = test_backend();
  workspace w("secagg-holders", 3);
  auto sc = secure_cfg(w, be, 3, 1);
  sc.force_route = [](std::uint32_t dev, std::uint64_t, const split::route& r) -> std::optional<split::route> {
    if (dev != 3 || r.cuts.front() == 8) return std::nullopt;
    return split::make_route(false, false, {8}, r.n_blocks);
  };
  std::vector<server::round_report> reports;
  sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
  const auto got = run_federation(w, be, sc, 3, false, [](device::agent_config& a) { a.secure_aggregation = true; });
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].secure_devices == 3);
  const auto d = core::load_dataset(w.data.string());
  const auto lay = core::layout_of(core::zoo_model("lenet5", d.train.item, d.train.n_classes));
  std::vector<std::vector<float>> local;
  for (std::uint32_t dev = 1; dev <= 3; ++dev)
    local.push_back(local_training(w, be, sc.opt, sc.seed, dev, 6, sc.batch));
  // The mean of the given devices' parameters of blocks [first, end), and the server's.
  const auto blocks = [&](const std::vector<float>& p, int first, int end) {
    return std::vector<float>(p.begin() + lay.param_offset[static_cast<std::size_t>(first)],
                              p.begin() + lay.param_offset[static_cast<std::size_t>(end)]);
  };
  const auto mean_of = [&](std::initializer_list<int> devs, int first, int end) {
    std::vector<float> m(blocks(got, first, end).size(), 0.0f);
    for (int dev : devs) {
      const auto p = blocks(local[static_cast<std::size_t>(dev - 1)], first, end);
      for (std::size_t i = 0; i < m.size(); ++i) m[i] += p[i] / static_cast<float>(devs.size());
    }
    return m;
  };
  // Blocks 0-3 (three holders): the secure mean of all three. Blocks 4-7: devices 1 and 2's
  // replicas, which the server held in the clear; device 3's never left it. Blocks 8-11: all
  // three, on the server.
  CHECK(max_rel_diff(blocks(got, 0, 4), mean_of({1, 2, 3}, 0, 4)) <= 1e-5);
  CHECK(max_rel_diff(blocks(got, 4, 8), mean_of({1, 2}, 4, 8)) <= 1e-5);
  CHECK(max_rel_diff(blocks(got, 4, 8), mean_of({1, 2, 3}, 4, 8)) > 1e-3);
  CHECK(max_rel_diff(blocks(got, 8, 12), mean_of({1, 2, 3}, 8, 12)) <= 1e-5);
}

TEST_CASE("under secure aggregation devices behind an edge taking blocks onto themselves mid-round keep the round") {
  // Devices 1 and 2 take blocks [3, 8) from the edge in the middle of round 1 (onto the board: at
  // once); 3 and 4 keep them on the edge. The edge's upload of [3, 8) names only 3 and 4: 1 and
  // 2's blocks there are theirs now, masked.
  const std::string be = test_backend();
  workspace w("secagg-edge-moves", 4);
  auto sc = secure_cfg(w, be, 4, 2);
  sc.edge_cuts = {3, 8};
  sc.force_route = [](std::uint32_t dev, std::uint64_t step, const split::route& r) -> std::optional<split::route> {
    if (dev > 2 || step / 6 != 1 || step % 6 < 2 || r.cuts.front() == 8) return std::nullopt;
    return split::make_route(false, true, {8, 8}, r.n_blocks);
  };
  std::vector<server::round_report> reports;
  sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
  std::atomic<int> starts = 0;
  sc.on_round_start = [&](std::uint64_t, int) { ++starts; };
  run_federation(w, be, sc, 4, true, [](device::agent_config& a) { a.secure_aggregation = true; });
  REQUIRE(reports.size() == 2);
  CHECK(starts == 2);  // no round ran again: no upload was refused
  CHECK(reports[0].n_resplits == 2);
  CHECK(reports[0].n_devices == 4);
  CHECK(reports[1].n_devices == 4);
  // Blocks 3-7 are on two devices only: kept out of the secure sum, logged.
  CHECK(reports[0].secure_blocks == std::vector<std::pair<int, int>>{{0, 3}});
}

TEST_CASE("under secure aggregation a move off a device waits for the round's end and leaves its optimizer state") {
  // Devices 1 and 2 move onto [0, 6) during round 1 (onto the board: at once), and are asked back
  // to [0, 4) during round 2 (off the board: from round 3's first step). Devices 3 and 4 stay.
  const std::string be = test_backend();
  workspace w("secagg-moves", 4);
  auto sc = secure_cfg(w, be, 4, 3);
  sc.force_route = [](std::uint32_t dev, std::uint64_t step, const split::route& r) -> std::optional<split::route> {
    const std::uint64_t round = step / 6;
    if (dev > 2) return std::nullopt;
    if (round == 1 && r.cuts.front() == 4) return split::make_route(false, false, {6}, r.n_blocks);
    if (round == 2 && r.cuts.front() == 6) return split::make_route(false, false, {4}, r.n_blocks);
    return std::nullopt;
  };
  std::vector<server::round_report> reports;
  sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
  sent_frames frames;
  run_federation(w, be, sc, 4, false, [&](device::agent_config& a) {
    a.secure_aggregation = true;
    a.on_send = frames.recorder();
  });
  REQUIRE(reports.size() == 3);
  // No block's sum is decoded from fewer than 3 devices holding it at the round's end.
  for (const auto& rep : reports) {
    std::vector<split::route> routes;
    for (const auto& [id, text] : rep.routes) routes.push_back(split::parse_route(text, 12));
    INFO("round " << rep.round << ": decoded " << split::ranges_text(rep.secure_blocks));
    CHECK(rep.secure_devices == 4);
    CHECK(split::ranges_text(rep.secure_blocks) == split::ranges_text(split::device_blocks(routes, 3)));
    CHECK(split::ranges_text(rep.secure_blocks) == "[0,4)");
  }
  CHECK(reports[1].routes.at(0).second == "device[0,6) server[6,12)");  // its move back waited
  CHECK(reports[2].routes.at(0).second == "device[0,4) server[4,12)");
  // The blocks that left a device: at a round's first step, without its optimizer state.
  const auto d = core::load_dataset(w.data.string());
  const auto model = core::zoo_model("lenet5", d.train.item, d.train.n_classes);
  int n_left = 0;
  for (const auto& f : frames.all()) {
    auto m = decoded(f);
    REQUIRE(m.ok());
    const auto* mg = m->as<cleave::wire::Migrate>();
    if (!mg) continue;
    ++n_left;
    CHECK(mg->step() == 18);
    for (const auto& v : protocol::block_state_of(*mg, model).optimizer_state)
      CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));
  }
  CHECK(n_left == 2);
}

TEST_CASE("secure aggregation with fewer devices than --secagg-min-holders is refused at start") {
  const std::string be = test_backend();
  workspace w("secagg-holders-refuse", 1);
  auto sc = server_cfg(w, be);
  sc.secure_aggregation = true;
  sc.min_devices = 2;
  CHECK_THROWS_WITH_AS(server::server_node(sc).run(), doctest::Contains("--secagg-min-holders"), core::error);
  sc.min_devices = 3;
  sc.secagg_min_holders = 1;
  CHECK_THROWS_WITH_AS(server::server_node(sc).run(), doctest::Contains("(here 1 and 3)"), core::error);
}

TEST_CASE("a device that drops after masking leaves the secure aggregate of the other three") {
  const std::string be = test_backend();
  workspace w("secagg-drop", 4);
  auto sc = server_cfg(w, be);
  sc.rounds = 1;
  sc.local_steps = 6;
  sc.min_devices = 4;
  sc.cuts = {4};
  sc.secure_aggregation = true;
  std::vector<server::round_report> reports;
  std::promise<std::uint16_t> port;
  record(sc, reports, port);
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  const auto sp = port.get_future().get();
  std::vector<std::unique_ptr<device::agent>> agents(4);
  std::vector<std::unique_ptr<runner>> ra;
  std::thread stopper;
  for (std::uint32_t id = 1; id <= 4; ++id) {
    auto ac = agent_cfg(w, id, sp, be, "server");
    if (id == 4)
      // Its masked upload never leaves: it goes, as a board losing power after masking would.
      ac.on_send = [&](std::span<const std::byte> f) {
        auto m = decoded(std::vector<std::byte>(f.begin(), f.end()));
        const auto* s = m.ok() ? m->as<cleave::wire::SecAgg>() : nullptr;
        if (!s || s->phase() != cleave::wire::SecAggPhase::masked) return;
        stopper = std::thread([&] { agents[3]->stop(); });
        throw core::error("powered off");
      };
    agents[id - 1] = std::make_unique<device::agent>(ac);
    ra.push_back(std::make_unique<runner>([a = agents[id - 1].get()] { a->run(); }));
  }
  rs.join();
  for (auto& r : ra) r->join();
  if (stopper.joinable()) stopper.join();
  CHECK(rs.error() == "");
  REQUIRE(reports.size() == 1);
  // Left once it was gone, not at the deadline.
  CHECK(reports[0].seconds < 0.75 * sc.round_deadline_s);
  // The device blocks [0, 4): the mean of devices 1-3 only.
  const auto d = core::load_dataset(w.data.string());
  const auto lay = core::layout_of(core::zoo_model("lenet5", d.train.item, d.train.n_classes));
  const auto n_device = static_cast<std::size_t>(lay.param_offset[4]);
  std::vector<double> mean(n_device, 0.0);
  for (std::uint32_t dev = 1; dev <= 3; ++dev) {
    const auto p = local_training(w, be, sc.opt, sc.seed, dev, 6, sc.batch);
    for (std::size_t i = 0; i < n_device; ++i) mean[i] += p[i] / 3.0;
  }
  const auto& got = srv.global_params();
  const double diff = max_rel_diff(std::vector<float>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(n_device)),
                                   std::vector<float>(mean.begin(), mean.end()));
  INFO("device blocks: max relative difference " << diff);
  CHECK(diff <= 1e-5);
}

TEST_CASE("secure aggregation refuses what would reveal one device's blocks") {
  const std::string be = test_backend();
  workspace w("secagg-refuse", 1);
  SUBCASE("a server aggregating one device, or by a rule that needs every replica") {
    auto sc = server_cfg(w, be);
    sc.secure_aggregation = true;
    sc.min_devices = 1;
    CHECK_THROWS_WITH_AS(server::server_node(sc).run(), doctest::Contains("--min-devices >= 2"), core::error);
    sc.min_devices = 2;
    sc.aggregate = split::parse_aggregate("median");
    CHECK_THROWS_WITH_AS(server::server_node(sc).run(), doctest::Contains("--aggregate mean"), core::error);
  }
  SUBCASE("a device with --secure-aggregation and a server without it") {
    const std::string error =
        run_one_device(w, be, server_cfg(w, be), [](device::agent_config& a) { a.secure_aggregation = true; });
    CHECK(error.find("does not aggregate securely") != std::string::npos);
  }
  SUBCASE("an edge with --secure-aggregation and a server without it") {
    auto sc = server_cfg(w, be);
    std::promise<std::uint16_t> port;
    sc.on_listening = [&](std::uint16_t p) { port.set_value(p); };
    server::server_node srv(sc);
    runner rs([&] { srv.run(); });
    auto en = start_edge(w, be, port.get_future().get(), [](edge::edge_config& ec) { ec.secure_aggregation = true; });
    device::agent a(agent_cfg(w, 1, en.port, be, "edge-1"));
    runner ra([&] { a.run(); });
    en.thread->join();  // it stops at the first plan it relays
    a.stop();
    srv.stop();
    ra.join();
    rs.join();
    CHECK(en.thread->error().find("does not aggregate securely") != std::string::npos);
    CHECK(en.thread->error().find("this edge runs with --secure-aggregation") != std::string::npos);
  }
}

TEST_CASE("the adaptive splitter keeps --min-device-blocks on a slowed device") {
  const std::string be = test_backend();
  workspace w("min-depth", 2);
  auto sc = server_cfg(w, be);
  sc.adaptive = true;
  sc.rounds = 3;
  sc.local_steps = 12;
  sc.min_devices = 2;
  sc.min_device_blocks = 5;  // the default cuts keep fewer: they are deepened
  std::vector<server::round_report> reports;
  sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
  run_federation(w, be, sc, 2, false, [](device::agent_config& a) {
    a.profile_every = 4;
    if (a.id == 2) a.slowdown = 40;  // without the minimum its blocks would go to the server
  });
  REQUIRE(reports.size() == 3);
  for (const auto& r : reports)
    for (const auto& [id, route] : r.routes) {
      CAPTURE(route);
      CHECK(std::stoi(route.substr(route.find(',') + 1)) >= 5);
    }
  SUBCASE("out of range, or configured cuts below it, are refused naming the option") {
    auto bad = server_cfg(w, be);
    bad.min_device_blocks = 13;
    CHECK_THROWS_WITH_AS(server::server_node(bad).run(), doctest::Contains("--min-device-blocks 13"), core::error);
    bad.min_device_blocks = 5;
    bad.cuts = {3};
    CHECK_THROWS_WITH_AS(server::server_node(bad).run(), doctest::Contains("fewer than --min-device-blocks 5"),
                         core::error);
  }
}

namespace {

// The (rows, values) of a frame a device sent when it is a Gradients message.
std::optional<std::pair<std::int64_t, std::vector<float>>> sent_gradient(const std::vector<std::byte>& frame) {
  auto m = decoded(frame);
  const auto* g = m.ok() ? m->as<cleave::wire::Gradients>() : nullptr;
  if (!g) return std::nullopt;
  const auto v = transport::view_of(*g->gradient());
  const auto vals = v.values<float>();
  return std::pair{v.shape[0], std::vector<float>(vals.begin(), vals.end())};
}

}  // namespace

TEST_CASE("--cut-gradient-noise adds each sample its gap to the largest gradient norm, repeatably") {
  const std::string be = test_backend();
  workspace w("grad-noise", 1);
  auto sc = server_cfg(w, be);
  sc.rounds = 1;
  sc.local_steps = 2;
  sc.u_shape = true;
  // The first gradient device 1 sends up: with and without noise computed from the same weights.
  auto first_gradient = [&](double noise, std::int64_t& rows) {
    sent_frames frames;
    run_federation(w, be, sc, 1, false, [&](device::agent_config& a) {
      a.cut_gradient_noise = noise;
      a.on_send = frames.recorder();
    });
    for (const auto& f : frames.all()) {
      REQUIRE(decoded(f).ok());
      if (auto g = sent_gradient(f)) {
        rows = g->first;
        return std::vector<double>(g->second.begin(), g->second.end());
      }
    }
    FAIL("no gradient left the device");
    return std::vector<double>{};
  };
  std::int64_t rows = 0;
  const auto plain = first_gradient(-1, rows), noisy = first_gradient(2, rows), again = first_gradient(2, rows);
  REQUIRE(plain.size() == noisy.size());
  CHECK(noisy == again);  // the same seeds, the same noise
  const auto n = static_cast<std::size_t>(rows), dim = plain.size() / n;
  std::vector<double> norm2(n, 0.0), noise2(n, 0.0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < dim; ++k) {
      norm2[i] += plain[i * dim + k] * plain[i * dim + k];
      const double e = noisy[i * dim + k] - plain[i * dim + k];
      noise2[i] += e * e;
    }
  const std::size_t top = static_cast<std::size_t>(std::max_element(norm2.begin(), norm2.end()) - norm2.begin());
  double gaps = 0, added = 0;
  for (std::size_t i = 0; i < n; ++i) gaps += 4 * (norm2[top] - norm2[i]), added += noise2[i];
  INFO("noise energy " << added << ", expected " << gaps);
  CHECK(noise2[top] == 0);  // the largest sample is left as it is
  CHECK(added > 0.7 * gaps);
  CHECK(added < 1.3 * gaps);
}

TEST_CASE("label groups with equalised cut gradients: one norm per micro-batch up the cut, and it trains") {
  const std::string be = test_backend();
  workspace w("label-groups", 1);
  auto sc = server_cfg(w, be);
  sc.rounds = 2;
  sc.local_steps = 20;
  sc.u_shape = true;
  sc.label_groups = 4;
  std::vector<server::round_report> reports;
  sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
  std::mutex mu;
  std::vector<std::vector<double>> norms;  // per gradient frame device 1 sent, per row
  // The device's gradient check compares what comes back with the sub-classes it trained on: an
  // honest server must not look like one steering its features.
  run_federation(w, be, sc, 1, false, [&](device::agent_config& a) {
    a.equalise_cut_gradients = true;
    a.gradient_check = cleave::device::gradient_check_mode::refuse;
    a.gradient_check_window = 8;
    a.on_send = [&](std::span<const std::byte> f) {
      const auto g = sent_gradient(std::vector<std::byte>(f.begin(), f.end()));
      if (!g) return;
      const auto& vals = g->second;
      const auto d = vals.size() / static_cast<std::size_t>(g->first);
      std::vector<double> rows;
      for (std::int64_t i = 0; i < g->first; ++i) {
        double s2 = 0;
        for (std::size_t k = 0; k < d; ++k) s2 += double(vals[i * d + k]) * vals[i * d + k];
        rows.push_back(std::sqrt(s2));
      }
      std::lock_guard lock(mu);
      norms.push_back(std::move(rows));
    };
  });
  REQUIRE(norms.size() == 40);
  for (const auto& rows : norms)
    for (const double n : rows) CHECK(n == doctest::Approx(rows.front()).epsilon(1e-4));
  REQUIRE(reports.size() == 2);
  // Scored on the class logits: a model at chance would sit near 0.1.
  CHECK(reports.back().test_accuracy > 0.3);
  CHECK(reports.back().test_loss < reports.front().test_loss + 0.5);
}

namespace {

// Device 1's Activations frames, in the order sent, as (rows, values).
struct sent_activations {
  std::mutex mu;
  std::vector<std::pair<std::int64_t, std::vector<float>>> frames;
  std::function<void(std::span<const std::byte>)> hook() {
    return [this](std::span<const std::byte> f) {
      auto m = decoded(std::vector<std::byte>(f.begin(), f.end()));
      if (!m.ok()) return;
      if (const auto* a = m->as<cleave::wire::Activations>()) {
        const auto v = transport::view_of(*a->activation());
        const auto vals = v.values<float>();
        std::lock_guard lock(mu);
        frames.emplace_back(v.shape[0], std::vector<float>(vals.begin(), vals.end()));
      }
    };
  }
};

double norm_of_row(const std::vector<float>& v, std::int64_t rows, std::int64_t i) {
  const auto d = static_cast<std::int64_t>(v.size()) / rows;
  double s = 0;
  for (std::int64_t k = 0; k < d; ++k) s += double(v[i * d + k]) * v[i * d + k];
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("--activation-clip bounds each sample at the cut and --activation-noise adds noise of its std, repeatably") {
  const std::string be = test_backend();
  workspace w("act-noise", 1);
  auto sc = server_cfg(w, be);
  sc.rounds = 1;
  sc.local_steps = 1;  // the first step's activations come from the same initial weights every run
  auto first = [&](double clip, double noise) {
    sent_activations s;
    run_federation(w, be, sc, 1, false, [&](device::agent_config& a) {
      a.activation_clip = clip;
      a.activation_noise = noise;
      a.on_send = s.hook();
    });
    REQUIRE(!s.frames.empty());
    return s.frames.front();
  };
  const auto [rows, plain] = first(0, 0);
  double mean_norm = 0;
  for (std::int64_t i = 0; i < rows; ++i) mean_norm += norm_of_row(plain, rows, i) / static_cast<double>(rows);
  const double c = mean_norm;  // about half the rows above it
  const auto clipped = first(c, 0).second;
  REQUIRE(clipped.size() == plain.size());
  const auto d = static_cast<std::int64_t>(plain.size()) / rows;
  int n_clipped = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    const double n = norm_of_row(plain, rows, i);
    const double s = n > c ? c / n : 1.0;
    n_clipped += n > c;
    CHECK(norm_of_row(clipped, rows, i) <= c * (1 + 1e-5));
    for (std::int64_t k = 0; k < d; ++k)
      CHECK(clipped[i * d + k] == doctest::Approx(plain[i * d + k] * s).epsilon(1e-5));
  }
  CHECK(n_clipped > 0);
  CHECK(n_clipped < rows);
  const double sigma = 0.5;
  const auto noisy = first(c, sigma).second, again = first(c, sigma).second;
  CHECK(noisy == again);
  double e2 = 0;
  for (std::size_t k = 0; k < noisy.size(); ++k) e2 += double(noisy[k] - clipped[k]) * (noisy[k] - clipped[k]);
  const double sd = std::sqrt(e2 / static_cast<double>(noisy.size()));
  CHECK(sd == doctest::Approx(sigma * c).epsilon(0.05));

  SUBCASE("noise without a clipping bound is refused naming both options") {
    auto a = agent_cfg(w, 1, 1, be, "server");
    a.activation_noise = 1;
    CHECK_THROWS_WITH_AS(device::agent{a}, doctest::Contains("--activation-noise 1 needs --activation-clip"),
                         core::error);
  }
}

TEST_CASE("the gradient check stays quiet under an honest server and refuses one whose gradients ignore the labels") {
  const std::string be = test_backend();
  workspace w("grad-check", 1);
  auto sc = server_cfg(w, be);
  sc.rounds = 2;
  sc.local_steps = 20;
  // Honest: two rounds with --gradient-check refuse finish.
  run_federation(w, be, sc, 1, false, [&](device::agent_config& a) {
    a.gradient_check = cleave::device::gradient_check_mode::refuse;
    a.gradient_check_window = 8;
  });
  // A server steering the device's features towards targets of its own (FSHA-style): it sends
  // back the gradient of |z - t|^2 / 2 for fixed random targets t, whatever the labels.
  sc.rounds = 1;
  const std::string error = run_one_device(w, be, sc, [](device::agent_config& ac) {
    ac.gradient_check = cleave::device::gradient_check_mode::refuse;
    ac.gradient_check_window = 8;
    ac.on_gradient = [](std::vector<float>& g, const std::vector<float>& sent, std::int64_t n) {
      REQUIRE(sent.size() == g.size());
      const auto d = static_cast<std::int64_t>(g.size()) / n;
      for (std::int64_t i = 0; i < n; ++i) {
        core::rng r(core::mix64(static_cast<std::uint64_t>(i) + 77));
        for (std::int64_t k = 0; k < d; ++k) g[i * d + k] = (sent[i * d + k] - r.normal()) * 1e-3f;
      }
    };
  });
  CHECK(error.find("do not follow this device's labels") != std::string::npos);
  CHECK(error.find("--gradient-check refuse") != std::string::npos);
}
