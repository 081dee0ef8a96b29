// The device agent's inside, shared by its source files: agent.cpp (link, plan, rounds and
// steps) and agent_upload.cpp (what a round sends up: replicas, secure aggregation, privacy).
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <mutex>
#include <optional>

#include "cleave/core/dataset.h"
#include "cleave/device/agent.h"
#include "cleave/privacy/cut_filters.h"
#include "cleave/privacy/masked_replica.h"
#include "cleave/privacy/secagg.h"
#include "cleave/protocol/protocol.h"
#include "cleave/runtime/executors.h"
#include "cleave/runtime/segment_runner.h"
#include "cleave/runtime/sessions.h"
#include "cleave/runtime/upload_collector.h"

namespace cleave::device {

class agent::impl {
 public:
  explicit impl(agent_config c);
  int run();
  void stop() { ex_.stop("stopped"); }
  void stop_on_signals() { ex_.stop_on_signals(); }

  std::string data_wanted_;  // "NAME=DIR" of an offered data set a job named (the run then ends)

 private:
  // ---- I/O thread ----
  void on_connected(const runtime::session_ptr& s);
  void on_message(transport::message m);
  void post(transport::message_builder&& m);

  // ---- compute thread ----
  void handle(const std::shared_ptr<transport::message>& m);
  void on_plan(const wire::Plan& p);
  void on_global_weights(const wire::GlobalWeights& g);
  void on_round_start(const wire::RoundStart& r);
  void on_migrate(const wire::Migrate& m);
  void on_step(const std::shared_ptr<transport::message>& m);
  asio::awaitable<void> run_round(std::uint64_t round, std::uint32_t steps, float lr, std::uint64_t gen);
  // Switches to the pending plan before `step`: hands over the blocks leaving, tells the route
  // (Cutover), waits for the blocks arriving. False when the round ended meanwhile.
  asio::awaitable<bool> cut_over(std::uint64_t step, std::uint64_t gen);
  bool over(std::uint64_t gen) const { return gen != round_gen_; }
  void abandon(const std::string& why);
  void forward_step(std::uint64_t step);
  void report_privacy(std::uint64_t round);
  void check_gradients();
  void next_batch(std::int64_t n, float* x, std::int32_t* y);
  void send_profile(std::uint64_t step);
  void upload_replicas(std::uint64_t round, std::uint64_t n_samples, const protocol::round_stats& stats);
  // Secure aggregation: a phase message of the server's (roster, a peer's share, the mask set,
  // the unmask request). A phase that fails leaves this round's masking: the server counts the
  // device as dropped and recovers the sum of the others.
  void on_secagg(const wire::SecAgg& m);
  void post_secagg(const protocol::secagg_desc& d);

  agent_config c_;
  runtime::executors ex_;
  runtime::signal wake_;  // compute thread: a micro-batch came back, blocks arrived, the round ended
  std::optional<transport::tls_context> tls_;
  std::optional<runtime::upstream> up_;
  std::optional<transport::link_schedule> schedule_;  // I/O thread
  std::unique_ptr<core::backend> be_;
  std::optional<runtime::segment_runner> runner_;
  // This device's training samples, in shard order; read-only once loaded. Its sample shape and
  // class count are kept beside it.
  std::shared_ptr<const core::data_source> shard_;
  core::shape item_;
  int n_classes_ = 0;
  std::uint64_t memory_budget_ = 0;
  std::mutex profile_mu_;
  std::vector<std::byte> latest_profile_;  // its frame, sent again after a reconnect

  // Compute thread.
  core::model_spec model_;                    // of the current plan
  std::optional<runtime::route_state> plan_;  // with a re-split announced, switched at a step boundary
  std::uint32_t edge_id_ = 0;                 // the edge on the route (0: none)
  std::uint32_t micro_batch_size_ = 0, n_micro_batches_ = 1;
  std::uint64_t round_ = 0, round_gen_ = 0;
  std::uint32_t attempt_ = 1;  // at round_ (see wire::RoundStart)
  bool in_round_ = false;
  std::uint32_t back_ = 0;  // micro-batches of the current step back through the bottom
  int missing_ = 0;         // blocks of a re-split still to arrive
  // The losses this device saw this round, and those computed here (a U-shaped top, or every
  // block here): the round's statistics.
  runtime::round_tally seen_, own_;
  int steps_since_profile_ = 0;
  // Within a round, how often at least a sign of its work goes up, and when the last one did.
  std::chrono::steady_clock::duration progress_every_ = std::chrono::seconds(1);
  std::chrono::steady_clock::time_point last_progress_{};
  float reported_bps_ = 0;     // the uplink's bandwidth in the last profile sent (compute executor)
  std::int64_t position_ = 0;  // samples drawn from this device's data stream
  std::vector<std::int64_t> order_;
  std::int64_t order_epoch_ = -1;
  std::map<split::micro_batch_id, core::tensor> labels_;  // U-shape: labels waiting for the top
  // With activation noise: how often each sample of the shard left through the cut this round,
  // and the privacy spent over the run.
  std::vector<std::uint32_t> releases_;
  privacy::rdp_accountant spent_;
  std::uint64_t warned_round_ = 0;  // the last round the gradient check warned in
  std::uint64_t run_id_ = 0;        // of the plan in force
  // What the last round started from (its segments' optimizer state, the data position): a round
  // run again (the server resumed from the checkpoint before it) starts from it too.
  struct round_start {
    std::uint64_t round = 0;
    split::route route;
    std::vector<runtime::segment_runner::optimizer_state> optimizer;
    std::int64_t position = 0;
  };
  std::optional<round_start> started_;
  // Secure aggregation of the current round: the client's keys and shares, and the device's
  // blocks and samples as training left them (masked once the server names the mask set).
  bool secure_plan_ = false;
  struct secure_round {
    privacy::secagg_client client;
    std::vector<privacy::held_segment> held;
    std::uint64_t n_samples = 0;
    bool trained = false;
  };
  std::optional<secure_round> secure_;
};

}  // namespace cleave::device
