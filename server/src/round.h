// The server's round as an object: open, start, collect and validate uploads, aggregate (plain,
// robust or secure), evaluate, report and hand over; it sees the rest of the server through
// round_host only, so that it runs and is tested without sockets.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cleave/core/trainer.h"
#include "cleave/runtime/executors.h"
#include "cleave/runtime/upload_collector.h"
#include "cleave/server/server_node.h"
#include "cleave/split/aggregator.h"
#include "secure_round.h"

namespace cleave::server {

using clock = std::chrono::steady_clock;
using device_routes = std::vector<std::pair<std::uint32_t, split::route>>;

// The global model: flat parameters and state of every block.
struct global_model {
  std::vector<float> params, buffers;
};

// The global model evaluated on the compute thread: its report, the test samples used (0: not
// evaluated this round) and the compute seconds of the round's last work there.
struct evaluation {
  core::eval_report report;
  std::int64_t test_samples = 0;
  double compute_s = 0;
};

// What a round needs of the rest of the server. Membership and messages on the I/O thread;
// install, gather, discard and evaluate on the compute thread.
class round_host {
 public:
  virtual ~round_host() = default;
  struct member {
    std::uint32_t id = 0;
    split::route route;
    const void* via = nullptr;  // the session it is attached through
  };
  // The devices connected now, and whether one is still attached through the session `via` (any
  // session: null).
  virtual std::vector<member> connected() const = 0;
  virtual bool attached(std::uint32_t id, const void* via) const = 0;
  // The route in force of a device that joined (it may cut over during a round), and the plan
  // epoch now.
  virtual const split::route& route_of(std::uint32_t id) const = 0;
  virtual std::uint32_t plan_epoch() const = 0;
  virtual void post(std::uint32_t id, transport::message_builder m) = 0;
  // Before a round reads its members: schedules, profiles and plans catch up.
  virtual void opening(std::uint64_t number) = 0;
  // The task that has the server's replicas of `routes` start from g at learning rate lr (and from
  // the optimizer state resumed, if any): asked for on the I/O thread, run on the compute thread.
  virtual std::function<void()> installer(const device_routes& routes, float lr, const global_model& g) = 0;
  // The server's replicas of the devices in `in` join avg; then every replica of `routes` goes.
  virtual void gather(const device_routes& routes, const std::set<std::uint32_t>& in, split::aggregator& avg) = 0;
  virtual void discard(const device_routes& routes) = 0;
  // The averaged model g: evaluated when `evaluate` (on the whole test split when `whole`).
  virtual evaluation evaluate(const global_model& g, bool evaluate, bool whole) = 0;
  // Bytes moved on the server's channels so far, and the cost model's step of devices `in`.
  virtual std::uint64_t bytes_moved() const = 0;
  virtual double predicted_step(const std::set<std::uint32_t>& in, std::vector<round_report::leg>* legs) = 0;
  // A round closed with report `rep` (routes: those of its devices at its end): the global model
  // goes to every holder and the checkpoint is written.
  virtual asio::awaitable<void> closed(const round_report& rep, const device_routes& routes) = 0;
};

enum class round_phase : std::uint8_t { idle, waiting, collecting, closing };
std::string_view phase_name(round_phase p);
// Devices may still train: the round collects, or closes (a straggler runs on).
inline bool trains(round_phase p) {
  return p == round_phase::collecting || p == round_phase::closing;
}

class round {
 public:
  round(const server_config& c, const core::model_spec& m, round_host& h, runtime::executors& ex,
        runtime::signal& wake);

  // Runs round `number` (its next attempt when the last run was of the same number and nobody
  // finished it) at learning rate lr from g, which becomes the round's average. False when nobody
  // finished it: it is to run again (and after max_futile attempts whose uploads were all refused,
  // the node fails instead).
  asio::awaitable<bool> run(std::uint64_t number, float lr, global_model& g);
  static constexpr int max_futile = 3;

  std::uint64_t number() const { return number_; }
  std::uint32_t attempt() const { return attempt_; }
  round_phase phase() const { return at_; }
  void set_phase(round_phase p) { at_ = p; }  // waiting for members, or idle at shutdown
  bool member(std::uint32_t id) const { return members_.count(id) > 0; }
  bool done(std::uint32_t id) const { return uploads_.is_done(id); }
  const round_report& last() const { return last_; }
  void restore_last(const round_report& r) { last_ = r; }

  // Membership: a device that joined again or left is counted out (true when it was in).
  bool counted_out(std::uint32_t id, bool rejoined);
  void channel_closed(const void* via) { uploads_.drop(via); }
  // Whether a step message of device `dev` (step, attempt) belongs to the round collecting now;
  // one that does and is an activation from the device itself is evidence of its work there.
  bool takes_step(std::uint32_t dev, std::uint64_t step, std::uint32_t attempt, bool device_activation = false);
  // A sign of device `dev`'s work at global step `step` (a profile, or a cut-over to a new plan:
  // `resplit`, counted while the round collects): in SplitFed mode a member that shows none for a
  // quarter of the deadline (at least 10 s: runtime::silence_allowed) is counted out. It also
  // tells how far the device is in the round (pace_of).
  void heard_from(std::uint32_t dev, std::uint64_t step, bool resplit = false);
  // The loss of samples computed here, in round `number`.
  void add_loss(std::uint64_t number, double loss, std::int64_t n, std::uint64_t correct);
  // A part of an upload from `via` (tier `from`, named `who` in refusals) for `devices`, each
  // attached through via. Throws core::error when it is refused.
  void on_upload(const void* via, core::tier from, const std::string& who, const std::vector<std::uint32_t>& devices,
                 const wire::ReplicaUpload& r, const protocol::weights_view& w);
  // Secure aggregation's messages from device `dev`; throws core::error when it breaks the rules.
  void on_secagg(std::uint32_t dev, const wire::SecAgg& m);
  // Whether uploads and secure aggregation's messages of round `number`, attempt `attempt` are taken.
  bool collects(std::uint64_t number, std::uint32_t attempt) const {
    return at_ == round_phase::collecting && number == number_ && attempt == attempt_;
  }
  void planner_ran(double seconds) { planner_s_ = std::max(planner_s_, seconds); }
  // How far member `id` is in the round (or was in the last): the steps it showed and their mean
  // time since the round started (0: none yet).
  struct pace {
    std::uint32_t steps = 0;
    double step_seconds = 0;
  };
  pace pace_of(std::uint32_t id) const;

 private:
  asio::awaitable<void> open(std::uint64_t number, float lr, const global_model& g);
  void start_training(std::uint32_t id, clock::time_point until);
  asio::awaitable<void> take_turns(clock::time_point deadline);
  // Waits until all_done() or the deadline, counting out members silent for `silence`.
  asio::awaitable<void> collect(clock::time_point deadline, clock::duration silence,
                                const std::function<bool()>& all_done);
  void abandon();
  asio::awaitable<void> close(global_model& g);
  round_report report(const evaluation& ev) const;

  const server_config& c_;
  const core::model_spec& model_;
  const core::flat_layout layout_;
  round_host& host_;
  runtime::executors& ex_;
  runtime::signal& wake_;
  std::uint64_t number_ = 0;
  std::uint32_t attempt_ = 1;
  round_phase at_ = round_phase::idle;
  clock::time_point t0_;
  float lr_ = 0;
  std::uint64_t bytes0_ = 0;
  device_routes routes_;                     // of the devices connected when it opened
  std::vector<std::uint32_t> participants_;  // asked to train
  std::set<std::uint32_t> members_;          // asked to train and still counted
  std::map<std::uint32_t, clock::time_point> heard_;  // the last sign of each member's work
  std::map<std::uint32_t, std::pair<std::uint32_t, clock::time_point>> paces_;  // steps shown, and when the last
  double train_seconds_ = 0;
  std::unique_ptr<split::aggregator> avg_;
  runtime::upload_collector uploads_;
  double server_compute_ = 0;
  int n_resplits_ = 0, overran_ = 0;
  double planner_s_ = 0;
  std::string refused_;  // the last upload refused in this round
  int futile_ = 0;       // attempts in a row in which uploads came and every one was refused
  secure_round secure_;
  round_report last_;
};

}  // namespace cleave::server
