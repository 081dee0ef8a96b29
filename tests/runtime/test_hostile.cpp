// Hostile devices: replica uploads outside the plan, with too many samples or non-finite values
// are refused and their devices counted out; a robust aggregation rule keeps one huge replica
// from dragging the global model, where the plain mean collapses.
#include <doctest/doctest.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <cmath>
#include <limits>
#include <mutex>

#include "cleave/core/trainer.h"
#include "cleave/protocol/protocol.h"
#include "cleave/transport/connect.h"
#include "federation.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

struct outcome {
  std::vector<server::round_report> reports;
  std::vector<float> params;
};

// A federation of four devices (behind one edge when `edge`); device 4 changes its uploads with
// `hostile`. Agents are stopped once the server is done: a refused one may be reconnecting.
outcome run_four(const workspace& w, const std::string& be, server::server_config sc, bool edge,
                 const std::function<void(std::vector<float>&, std::vector<float>&)>& hostile) {
  outcome out;
  std::promise<std::uint16_t> port;
  record(sc, out.reports, port);
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  const std::uint16_t sp = port.get_future().get();
  test_edge en;
  std::uint16_t up = sp;
  if (edge) up = (en = start_edge(w, be, sp)).port;
  std::vector<std::unique_ptr<device::agent>> agents;
  std::vector<std::unique_ptr<runner>> ra;
  for (std::uint32_t i = 1; i <= 4; ++i) {
    auto ac = agent_cfg(w, i, up, be, edge ? "edge-1" : "server");
    if (i == 4) ac.on_upload = hostile;
    agents.push_back(std::make_unique<device::agent>(ac));
    ra.push_back(std::make_unique<runner>([a = agents.back().get()] { a->run(); }));
  }
  rs.join();
  for (auto& a : agents) a->stop();
  if (en.node) en.node->stop();
  for (auto& r : ra) r->join();
  if (en.thread) en.thread->join();
  CHECK(rs.error() == "");
  out.params = srv.global_params();
  return out;
}

// Four devices, ten steps a round at a rate at which three rounds learn the test set (a faster
// one makes the honest average itself unstable).
server::server_config four_device_cfg(const workspace& w, const std::string& be, int rounds) {
  auto sc = server_cfg(w, be);
  sc.rounds = rounds;
  sc.local_steps = 10;
  sc.opt.lr = 0.02f;
  sc.min_devices = 4;
  sc.round_deadline_s = 30;
  return sc;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

void set_all(std::vector<float>& params, std::vector<float>& buffers, float value) {
  std::fill(params.begin(), params.end(), value);
  std::fill(buffers.begin(), buffers.end(), value);
}

}  // namespace

TEST_CASE("a device uploading non-finite weights is refused each round with the reason, and the model stays finite") {
  const std::string be = test_backend();
  for (const bool edge : {false, true}) {
    SUBCASE(edge ? "behind an edge" : "connected directly") {
      workspace w(edge ? "nan-e" : "nan", 4);
      const auto sc = four_device_cfg(w, be, 3);
      log_capture logs;
      const auto got = run_four(w, be, sc, edge, [](std::vector<float>& p, std::vector<float>& b) {
        set_all(p, b, std::numeric_limits<float>::quiet_NaN());
      });
      REQUIRE(got.reports.size() == 3);
      for (const auto& r : got.reports) {
        CHECK(r.n_participants == 4);
        CHECK(r.n_devices == 3);
        CHECK(std::isfinite(r.test_loss));
      }
      MESSAGE(std::string(edge ? "behind an edge" : "connected directly")
              << ": the NaN device refused, test accuracy " << got.reports.back().test_accuracy);
      CHECK(got.reports.back().test_accuracy > 0.5);
      CHECK(all_finite(got.params));
      // The node it uploads to names it and the fault.
      CHECK(logs.count({"device 4: replica of round 1 refused", "hold a non-finite value: parameter 0 (nan)"}) >= 1);
      CHECK(logs.count({"device 4: replica of round 2 refused"}) >= 1);
    }
  }
}

TEST_CASE(
    "one device uploading huge weights: the median and trimmed mean keep the honest accuracy, the mean collapses") {
  const std::string be = test_backend();
  workspace w("huge", 4);
  const int rounds = 3;
  const auto huge = [](std::vector<float>& p, std::vector<float>& b) { set_all(p, b, 1e30f); };
  const auto honest = run_four(w, be, four_device_cfg(w, be, rounds), false, {});
  REQUIRE(honest.reports.size() == static_cast<std::size_t>(rounds));
  const double want = honest.reports.back().test_accuracy;

  auto median_cfg = four_device_cfg(w, be, rounds);
  median_cfg.aggregate = split::parse_aggregate("median");
  const auto median = run_four(w, be, median_cfg, false, huge);
  // Through an edge, which must then forward each device's replicas instead of pre-averaging.
  auto trimmed_cfg = four_device_cfg(w, be, rounds);
  trimmed_cfg.aggregate = split::parse_aggregate("trimmed-mean:0.25");
  const auto trimmed = run_four(w, be, trimmed_cfg, true, huge);
  // The mean: one round is enough (the next would train from the wrecked model).
  const auto mean = run_four(w, be, four_device_cfg(w, be, 1), false, huge);

  REQUIRE(median.reports.size() == static_cast<std::size_t>(rounds));
  REQUIRE(trimmed.reports.size() == static_cast<std::size_t>(rounds));
  REQUIRE(mean.reports.size() == 1);
  const double acc_median = median.reports.back().test_accuracy, acc_trimmed = trimmed.reports.back().test_accuracy;
  const double acc_mean = mean.reports.back().test_accuracy;
  MESSAGE("test accuracy: honest " << want << ", huge + median " << acc_median << ", huge + trimmed-mean:0.25 (edge) "
                                   << acc_trimmed << ", huge + mean " << acc_mean << " (largest weight "
                                   << max_abs(mean.params) << ")");
  for (const auto* r : {&median, &trimmed}) {
    for (const auto& rep : r->reports) CHECK(rep.n_devices == 4);  // huge but finite: not refused
    CHECK(all_finite(r->params));
    CHECK(max_abs(r->params) < 100);
  }
  CHECK(std::fabs(acc_median - want) <= 0.01);
  CHECK(std::fabs(acc_trimmed - want) <= 0.01);
  CHECK(max_abs(mean.params) > 1e20);
  CHECK(acc_mean < want - 0.3);
}

TEST_CASE(
    "a device uploading blocks outside its route or more samples than its steps allow is refused with the reason") {
  const std::string be = test_backend();
  workspace w("outside", 3);
  auto sc = server_cfg(w, be);
  sc.local_steps = 10;
  sc.cuts = {4};
  log_capture logs;
  // Two rogue devices upload zeros of the right size as soon as their round starts: device 2 the
  // whole model, device 3 its own blocks [0,4) claiming a billion samples.
  const auto run =
      run_with_rogues(w, be, sc, [](transport::channel& ch, std::uint32_t id) -> asio::awaitable<std::string> {
        core::model_spec model;
        std::string said;
        for (;;) {
          auto m = co_await ch.receive();
          if (!m) co_return said + "; closed";
          if (const auto* p = m->as<cleave::wire::Plan>()) model = core::parse_model_spec(p->model()->str(), "plan");
          if (const auto* e = m->as<cleave::wire::Error>()) said = e->message() ? e->message()->str() : "";
          const auto* r = m->as<cleave::wire::RoundStart>();
          if (!r) continue;
          const auto lay = core::layout_of(model);
          protocol::replica_desc d;
          d.round = r->round();
          d.node_id = id;
          d.first_block = 0;
          d.end_block = id == 2 ? static_cast<std::uint32_t>(model.n_blocks()) : 4;
          d.n_samples = id == 2 ? 640 : 1000000000;
          d.devices = std::span(&id, 1);
          const std::vector<float> p(static_cast<std::size_t>(lay.param_offset[d.end_block]), 0.0f);
          const std::vector<float> b(static_cast<std::size_t>(lay.buffer_offset[d.end_block]), 0.0f);
          co_await ch.send(protocol::make_replica_upload(d, p, b));
        }
      });
  CHECK(run.server_error == "");
  // Each is told why, in an Error before its channel closes, and the server logs it.
  const std::string outside =
      "device 2: replica of round 1 refused: blocks [0,12) are not one of its segments on route device[0,4) "
      "server[4,12)";
  const std::string too_many =
      "device 3: replica of round 1 refused: blocks [0,4) claim 1000000000 samples; the round's steps allow 640";
  CHECK(run.rogue2 == outside + "; closed");
  CHECK(run.rogue3 == too_many + "; closed");
  CHECK(logs.count({outside}) >= 1);
  CHECK(logs.count({too_many}) >= 1);
  REQUIRE(run.reports.size() == 1);
  CHECK(run.reports[0].n_participants == 3);
  CHECK(run.reports[0].n_devices == 1);
  CHECK(run.reports[0].test_accuracy > 0.0);
}

TEST_CASE("when every upload of a round is refused three times in a row, the server stops with the reason") {
  const std::string be = test_backend();
  workspace w("futile", 1);
  auto sc = server_cfg(w, be);
  sc.rounds = 5;
  sc.local_steps = 5;
  sc.round_deadline_s = 30;
  std::vector<server::round_report> reports;
  std::promise<std::uint16_t> port;
  record(sc, reports, port);
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  auto ac = agent_cfg(w, 1, port.get_future().get(), be, "server");
  ac.on_upload = [](std::vector<float>& p, std::vector<float>& b) {
    set_all(p, b, std::numeric_limits<float>::infinity());
  };
  device::agent a(ac);
  runner ra([&] { a.run(); });
  rs.join();
  a.stop();
  ra.join();
  CHECK(reports.empty());
  CHECK_MESSAGE(rs.error().find("round 1: every upload was refused in 3 attempts in a row (last: device 1: ") !=
                    std::string::npos,
                rs.error());
  CHECK(rs.error().find("non-finite") != std::string::npos);
}

TEST_CASE("a device sending NaN activations poisons only its own server replica, which is left out of the average") {
  const std::string be = test_backend();
  workspace w("nan-act", 3);
  auto sc = server_cfg(w, be);
  sc.local_steps = 3;
  log_capture logs;
  // Device 2 trains its steps with NaN activations and uploads finite weights of its own blocks;
  // device 3 leaves when the round starts.
  const auto run =
      run_with_rogues(w, be, sc, [](transport::channel& ch, std::uint32_t id) -> asio::awaitable<std::string> {
        if (id == 3) {  // leaves when its round starts
          for (;;) {
            auto m = co_await ch.receive();
            if (!m || m->as<cleave::wire::RoundStart>()) co_return "left";
          }
        }
        core::model_spec model;
        split::route route;
        std::uint32_t mb_size = 0, n_mb = 0;
        for (;;) {
          auto m = co_await ch.receive();
          if (!m) co_return "closed: " + m.error().reason();
          if (const auto* p = m->as<cleave::wire::Plan>()) {
            model = core::parse_model_spec(p->model()->str(), "plan");
            route = protocol::route_for(*p, id, model.n_blocks());
            mb_size = p->micro_batch_size();
            n_mb = p->n_micro_batches();
          }
          const auto* r = m->as<cleave::wire::RoundStart>();
          if (!r) continue;
          const auto cut = static_cast<std::uint32_t>(route.end(0));
          const core::shape in = model.blocks[cut].in.batched(static_cast<int>(mb_size));
          const std::vector<float> x(static_cast<std::size_t>(in.numel()), std::numeric_limits<float>::quiet_NaN());
          const std::vector<std::int32_t> y(mb_size, 1);
          for (std::uint32_t s = 0; s < r->local_steps(); ++s) {
            for (std::uint32_t mb = 0; mb < n_mb; ++mb) {
              const protocol::step_key key{r->epoch(), r->round() * r->local_steps() + s, mb, id, cut};
              const transport::tensor_source act{core::dtype::f32, in, x.data(), "activation"};
              const transport::tensor_source lab{core::dtype::i32, core::shape({static_cast<std::int64_t>(mb_size)}),
                                                 y.data(), "labels"};
              // No batch fields (a sender that does not micro-batch), as this device always sent.
              co_await ch.send(protocol::make_activations(key, {0, 0}, act, &lab));
            }
            for (std::uint32_t got = 0; got < n_mb;) {
              auto g = co_await ch.receive();
              if (!g) co_return "closed: " + g.error().reason();
              if (g->as<cleave::wire::Gradients>()) ++got;
            }
          }
          const auto lay = core::layout_of(model);
          protocol::replica_desc d;
          d.round = r->round();
          d.node_id = id;
          d.first_block = 0;
          d.end_block = cut;
          d.n_samples = static_cast<std::uint64_t>(r->local_steps()) * mb_size * n_mb;
          d.devices = std::span(&id, 1);
          const std::vector<float> p(static_cast<std::size_t>(lay.param_offset[cut]), 0.0f);
          const std::vector<float> b(static_cast<std::size_t>(lay.buffer_offset[cut]), 0.0f);
          co_await ch.send(protocol::make_replica_upload(d, p, b));
        }
      });
  CHECK(run.server_error == "");
  REQUIRE(run.reports.size() == 1);
  CHECK(run.reports[0].n_devices == 2);
  CHECK(std::isfinite(run.reports[0].test_loss));
  CHECK(all_finite(run.params));
  CHECK(logs.count({"device 2: its replica of blocks", "holds a non-finite value after the round ("}) >= 1);
}
