// What the server tells about itself: its metrics (`--metrics`) and its run log (`--run-log`,
// one JSON object per round).
#include <nlohmann/json.hpp>

#include <chrono>

#include "server_impl.h"

namespace cleave::server {

void server_node::impl::open_observers() {
  if (!c_.run_log.empty()) {
    run_log_.open(c_.run_log, std::ios::app);
    if (!run_log_) throw core::error("--run-log '" + c_.run_log.string() + "': cannot open it for writing");
  }
  ex_.collect_on_io([this] { publish_links_and_devices(); });
  if (!c_.metrics.empty()) ex_.serve_metrics(c_.metrics);
  if (!c_.dashboard.empty()) open_dashboard();
}

void server_node::impl::publish_links_and_devices() {
  auto& m = ex_.metrics();
  if (acceptor_) acceptor_->publish_links();
  m.set("cleave_devices_connected", {}, n_connected());
  for (const auto& [id, d] : devices_) {
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

void server_node::impl::observe_round(const round_report& rep) {
  auto& m = ex_.metrics();
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
  const auto per_device = predicted_steps(ids);
  for (const auto& [id, route] : rep.routes) {
    const auto it = per_device.find(id);
    const double predicted = it != per_device.end() ? it->second : 0.0;
    if (predicted > 0) m.set("cleave_device_predicted_step_seconds", {{"device", std::to_string(id)}}, predicted);
    if (const auto d = devices_.find(id); d != devices_.end()) d->second.predicted_step_seconds = predicted;
    devices.push_back({{"id", id}, {"route", route}, {"predicted_step_seconds", predicted}});
  }
  history_.push_back({{"round", rep.round},
                      {"train_loss", rep.train_loss},
                      {"train_accuracy", rep.train_accuracy},
                      {"evaluated", rep.evaluated},
                      {"test_loss", rep.test_loss},
                      {"test_accuracy", rep.test_accuracy},
                      {"step_seconds", rep.step_seconds},
                      {"predicted_step_seconds", rep.predicted_step_seconds},
                      {"devices", rep.n_devices},
                      {"resplits", rep.n_resplits},
                      {"seconds", rep.seconds}});
  if (!run_log_.is_open()) return;
  nlohmann::json j = {
      {"secure_devices", rep.secure_devices},
      {"round", rep.round},
      {"rounds", c_.rounds},
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
      {"refusals", m.value("cleave_refusals_total", {{"reason", "upload"}})},
      {"started_at",
       std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() - rep.seconds},
      {"resident_bytes", metrics::resident_bytes()},
      {"routes", devices}};
  run_log_ << j.dump() << '\n';
  run_log_.flush();
  if (!run_log_) {
    spdlog::error("server: --run-log '{}': write failed; no more lines go to it", c_.run_log.string());
    run_log_.close();
  }
}

}  // namespace cleave::server
