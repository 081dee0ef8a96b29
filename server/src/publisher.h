// What the server tells about itself: its metrics (`--metrics`), its run log (`--run-log`, one
// JSON object per round) and its dashboard (`--dashboard`), made from the parts it reads.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cleave/runtime/executors.h"
#include "cleave/runtime/sessions.h"
#include "membership.h"
#include "round.h"
#include "splitter.h"

namespace cleave::server {

// The dashboard's page (dashboard/index.html) with its first state, a JSON object as
// /api/state gives it.
std::string dashboard_page(const std::string& state);

class publisher {
 public:
  // What it reads, all on the I/O thread (the acceptor once it listens).
  struct view {
    const server_config& c;
    const core::model_spec& model;
    runtime::executors& ex;
    const membership& members;
    splitter& plans;
    const round& now;
    const std::optional<runtime::acceptor>& acceptor;
  };
  explicit publisher(view v) : v_(v) {}

  // Before the rounds: a --run-log that cannot be written is an error then; the metrics and the
  // dashboard are served. test_size: the samples of the whole test split.
  void open(std::string backend, std::int64_t test_size);
  void set_run(std::uint64_t run_id) { run_id_ = run_id; }
  // A round's figures, when it closed: logged, in the metrics, the run log and the dashboard.
  void observe(const round_report& rep);

 private:
  void log_round(const round_report& rep) const;
  void publish_links_and_devices();  // at every scrape
  void open_dashboard();
  // The dashboard's state, made on the I/O thread (the last one made when it cannot answer in time).
  std::string dashboard_state();
  nlohmann::json board() const;
  nlohmann::json board_devices() const;
  nlohmann::json board_links() const;  // the server's own, then those below the edges
  nlohmann::json board_cuts() const;   // the newest re-splits, oldest first
  static constexpr std::size_t max_board_cuts = 1000;
  nlohmann::json log_line(const round_report& rep, nlohmann::json devices);

  view v_;
  std::string backend_;
  std::uint64_t run_id_ = 0;
  std::int64_t test_size_ = 0;
  std::ofstream run_log_;
  std::vector<nlohmann::json> history_;        // one row per round closed, for the dashboard's curves
  double started_at_ = 0;                      // Unix seconds when the run opened
  std::map<std::uint32_t, double> predicted_;  // the cost model's step of each device last round
  std::mutex board_mu_;
  std::string board_cache_ = "{}";
};

}  // namespace cleave::server
