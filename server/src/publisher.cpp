// What the server tells about itself: its metrics (`--metrics`) and its run log (`--run-log`,
// one JSON object per round).
#include "publisher.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <map>

#include "cleave/core/clock.h"
#include "cleave/metrics/exporter.h"

namespace cleave::server {

void publisher::open(std::string backend, std::int64_t test_size) {
  backend_ = std::move(backend);
  test_size_ = test_size;
  started_at_ = core::unix_now();
  const auto& c = v_.c;
  if (!c.run_log.empty()) {
    run_log_.open(c.run_log, std::ios::app);
    if (!run_log_) throw core::error("--run-log '" + c.run_log.string() + "': cannot open it for writing");
  }
  v_.ex.collect_on_io([this] { publish_links_and_devices(); });
  if (!c.metrics.empty()) v_.ex.serve_metrics(c, [this] { return v_.acceptor ? std::string() : "not listening yet"; });
  if (!c.dashboard.empty()) open_dashboard();
}

void publisher::publish_links_and_devices() {
  auto& m = v_.ex.metrics();
  if (v_.acceptor) v_.acceptor->publish_links();
  m.set("cleave_devices_connected", {}, v_.members.n_connected());
  for (const auto& [id, d] : v_.members.all()) {
    const std::string dev = std::to_string(id);
    for (const core::tier t : {core::tier::device, core::tier::edge, core::tier::server}) {
      const metrics::labels l{{"device", dev}, {"tier", std::string(core::tier_name(t))}};
      if (!d.connected) {
        m.erase("cleave_device_blocks", l);
        continue;
      }
      int blocks = 0;
      for (const int seg : d.rs.route.segments_on(t)) blocks += d.rs.route.end(seg) - d.rs.route.begin(seg);
      m.set("cleave_device_blocks", l, blocks);
    }
    if (!d.connected) m.erase("cleave_device_predicted_step_seconds", {{"device", dev}});
  }
}

namespace {

// "1-4,7,9-12" of sorted ids.
std::string id_ranges(const std::vector<std::uint32_t>& ids) {
  std::string out;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(ids[i]) + (j > i ? "-" + std::to_string(ids[j]) : "");
    i = j + 1;
  }
  return out;
}

}  // namespace

void publisher::log_round(const round_report& rep) const {
  const auto& c = v_.c;
  const bool scheduled = c.lr_schedule != core::schedule_kind::constant || c.warmup_rounds > 0;
  std::string test = "test not evaluated";
  if (rep.evaluated)
    test = fmt::format("test loss {:.4f} acc {:.4f}{}", rep.test_loss, rep.test_accuracy,
                       rep.test_samples < test_size_ ? fmt::format(" ({} samples)", rep.test_samples) : "");
  spdlog::info(
      "round {}/{}: {}/{} devices, train loss {:.4f} acc {:.4f}, {}; compute device {:.1f} s, edge {:.1f} s, server "
      "{:.1f} s; {:.1f} MB moved; {:.1f} s{}",
      rep.round, c.rounds, rep.n_devices, rep.n_participants, rep.train_loss, rep.train_accuracy, test,
      rep.device_compute_s, rep.edge_compute_s, rep.server_compute_s, rep.bytes_moved / 1e6, rep.seconds,
      scheduled ? fmt::format("; lr {:.4g}", rep.learning_rate) : std::string());
  if (rep.predicted_step_seconds > 0)
    spdlog::info("round {}: step {:.1f} ms, predicted {:.1f} ms ({:+.0f}%), {} re-split{}", rep.round,
                 rep.step_seconds * 1e3, rep.predicted_step_seconds * 1e3,
                 (rep.predicted_step_seconds / rep.step_seconds - 1.0) * 100.0, rep.n_resplits,
                 rep.n_resplits == 1 ? "" : "s");
  // The plans of devices that re-split, as they were priced.
  for (std::size_t i = 0; i < rep.legs.size();) {
    const std::uint32_t dev = rep.legs[i].device;
    std::string ran;
    for (; i < rep.legs.size() && rep.legs[i].device == dev; ++i) {
      const auto& l = rep.legs[i];
      ran += fmt::format("{}{} for {} step{} ({:.1f} ms each", ran.empty() ? "" : ", then ", l.route, l.steps,
                         l.steps == 1 ? "" : "s", l.step_seconds * 1e3);
      ran += l.migration_seconds > 0 ? fmt::format(", moving on {:.1f} ms)", l.migration_seconds * 1e3) : ")";
    }
    spdlog::info("round {}: device {} ran {}", rep.round, dev, ran);
  }
  // One line per route, naming its devices (runs of ids as ranges).
  std::map<std::string, std::vector<std::uint32_t>> by_route;
  for (const auto& [id, route] : rep.routes) by_route[route].push_back(id);
  for (const auto& [route, ids] : by_route)
    spdlog::info("round {}: device{} {}: {}", rep.round, ids.size() == 1 ? "" : "s", id_ranges(ids), route);
}

void publisher::observe(const round_report& rep) {
  log_round(rep);
  auto& m = v_.ex.metrics();
  m.add("cleave_rounds_completed_total", {});
  m.set("cleave_round", {}, static_cast<double>(rep.round));
  m.set("cleave_devices_participating", {}, rep.n_devices);
  m.set("cleave_train_loss", {}, rep.train_loss);
  m.set("cleave_train_accuracy", {}, rep.train_accuracy);
  if (rep.evaluated) {
    m.add("cleave_evaluations_total", {});
    m.set("cleave_test_loss", {}, rep.test_loss);
    m.set("cleave_test_accuracy", {}, rep.test_accuracy);
  }
  m.set("cleave_learning_rate", {}, rep.learning_rate);
  m.add("cleave_compute_seconds_total", {{"tier", "device"}}, rep.device_compute_s);
  m.add("cleave_compute_seconds_total", {{"tier", "edge"}}, rep.edge_compute_s);
  m.add("cleave_compute_seconds_total", {{"tier", "server"}}, rep.server_compute_s);
  m.set("cleave_step_seconds", {}, rep.step_seconds);
  if (rep.predicted_step_seconds > 0) m.set("cleave_predicted_step_seconds", {}, rep.predicted_step_seconds);
  m.add("cleave_resplits_total", {}, rep.n_resplits);
  nlohmann::json devices = nlohmann::json::array();
  std::set<std::uint32_t> ids;
  for (const auto& [id, route] : rep.routes) ids.insert(id);
  const auto per_device = v_.plans.predicted_steps(ids);
  for (const auto& [id, route] : rep.routes) {
    const auto it = per_device.find(id);
    const double predicted = it != per_device.end() ? it->second : 0.0;
    if (predicted > 0) m.set("cleave_device_predicted_step_seconds", {{"device", std::to_string(id)}}, predicted);
    predicted_[id] = predicted;
    devices.push_back({{"id", id}, {"route", route}, {"predicted_step_seconds", predicted}});
  }
  history_.push_back(
      {{"round", rep.round},
       {"train_loss", rep.train_loss},
       {"train_accuracy", rep.train_accuracy},
       {"evaluated", rep.evaluated},
       {"test_loss", rep.test_loss},
       {"test_accuracy", rep.test_accuracy},
       {"step_seconds", rep.step_seconds},
       {"predicted_step_seconds", rep.predicted_step_seconds},
       {"devices", rep.n_devices},
       {"resplits", rep.n_resplits},
       {"seconds", rep.seconds},
       {"at", core::unix_now()},
       {"samples_per_second",
        rep.seconds > 0 ? static_cast<double>(rep.n_devices) * v_.c.local_steps * v_.c.batch / rep.seconds : 0.0}});
  if (!run_log_.is_open()) return;
  run_log_ << log_line(rep, std::move(devices)).dump() << '\n';
  run_log_.flush();
  if (!run_log_) {
    spdlog::error("server: --run-log '{}': write failed; no more lines go to it", v_.c.run_log.string());
    run_log_.close();
  }
}

nlohmann::json publisher::log_line(const round_report& rep, nlohmann::json devices) {
  return {{"secure_devices", rep.secure_devices},
          {"round", rep.round},
          {"rounds", v_.c.rounds},
          {"devices", rep.n_devices},
          {"participants", rep.n_participants},
          {"seconds", rep.seconds},
          {"train_seconds", rep.train_seconds},
          {"train_loss", rep.train_loss},
          {"train_accuracy", rep.train_accuracy},
          {"evaluated", rep.evaluated},
          {"test_loss", rep.test_loss},
          {"test_accuracy", rep.test_accuracy},
          {"test_samples", rep.test_samples},
          {"compute_seconds",
           {{"device", rep.device_compute_s}, {"edge", rep.edge_compute_s}, {"server", rep.server_compute_s}}},
          {"bytes_moved", rep.bytes_moved},
          {"step_seconds", rep.step_seconds},
          {"predicted_step_seconds", rep.predicted_step_seconds},
          {"learning_rate", rep.learning_rate},
          {"resplits", rep.n_resplits},
          {"planner_seconds", rep.planner_seconds},
          {"refusals", v_.ex.metrics().value("cleave_refusals_total", {{"reason", "upload"}})},
          {"started_at", core::unix_now() - rep.seconds},
          {"resident_bytes", metrics::resident_bytes()},
          {"routes", std::move(devices)}};
}

}  // namespace cleave::server
