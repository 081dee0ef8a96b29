// The server node's inside, shared by its source files: server_node.cpp (channels, joins,
// steps, rounds) and server_resplit.cpp (profiles, plans, re-splits, migrations).
#pragma once

#include "cleave/server/server_node.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "adaptive.h"
#include "cleave/backend/registry.h"
#include "cleave/core/aggregate.h"
#include "cleave/core/checkpoint.h"
#include "cleave/core/pipeline.h"
#include "cleave/core/profiler.h"
#include "cleave/core/random.h"
#include "cleave/core/splitter.h"
#include "cleave/core/trainer.h"
#include "cleave/transport/emulation.h"
#include "cleave/transport/listener.h"
#include "cleave/transport/outbox.h"
#include "cleave/transport/protocol.h"
#include "cleave/transport/tensor_io.h"
#include "default_cuts.h"
#include "held_steps.h"

namespace cleave::server {

using clock = std::chrono::steady_clock;

class server_node::impl {
 public:
  explicit impl(server_config c) : c_(std::move(c)), work_guard_(asio::make_work_guard(work_)) {}

  // The learning rate of round r (1-based) and whether it changes between rounds.
  float round_lr(std::uint64_t r) const {
    core::optimizer_config s = c_.opt;
    s.schedule = c_.lr_schedule;
    s.total_steps = c_.rounds;
    s.step_size = std::max(1, c_.rounds / 3);
    s.warmup_steps = c_.warmup_rounds;
    return core::learning_rate(s, static_cast<std::int64_t>(r) - 1);
  }
  bool scheduled_lr() const { return c_.lr_schedule != core::schedule_kind::constant || c_.warmup_rounds > 0; }
  ~impl() {
    work_guard_.reset();
    work_.stop();
    if (worker_.joinable()) worker_.join();
  }

  round_report run();
  void stop() {
    asio::post(io_, [this] { shutdown("stopped"); });
  }
  std::vector<float> global_p_, global_b_;

 private:
  struct peer {
    std::uint32_t id = 0;
    transport::node_role role = transport::node_role::device;
    std::string identity;
    transport::channel ch;
    std::shared_ptr<transport::outbox> out;
    bool alive = true;
    std::set<std::uint32_t> devices;  // edges: devices behind it
    std::uint64_t bytes_mark = 0;
  };
  struct device_state {
    std::shared_ptr<peer> via;
    bool behind_edge = false;
    core::route route;
    std::uint32_t epoch = 0;
    std::optional<core::route> next;  // announced, waiting for the device's Cutover
    std::uint32_t next_epoch = 0;
    std::uint64_t last_step = ~0ULL;  // the last step seen
    bool measured = true;             // has reported a profile since its last re-split
    bool connected = false;
    bool participant = false;
    bool done = false;
    std::uint64_t n_samples = 0;
  };

  // I/O thread.
  asio::awaitable<void> accept_loop();
  asio::awaitable<void> serve(std::shared_ptr<peer> p);
  asio::awaitable<void> drive_rounds();
  asio::awaitable<bool> wait_until(const std::function<bool()>& cond, clock::time_point deadline);
  void notify() { wake_.cancel(); }
  void drop_peer(const std::shared_ptr<peer>& p, const std::string& reason);
  void on_message(const std::shared_ptr<peer>& p, transport::message m);
  void register_device(const std::shared_ptr<peer>& via, const wire::Hello& h);
  void device_gone(std::uint32_t id, const std::string& reason);
  void on_step_message(const std::shared_ptr<peer>& p, transport::message m, bool is_activation);
  void on_replica(const std::shared_ptr<peer>& p, const wire::ReplicaUpload& r);
  // Re-splits: announce a new route, switch at the device's Cutover, receive moved blocks.
  void propose(std::uint32_t device, const core::route& r, const std::string& why);
  void on_cutover(const std::shared_ptr<peer>& p, const wire::Cutover& c);
  void on_migrate(const std::shared_ptr<peer>& p, const wire::Migrate& m);
  // Worker: a migration of dev's blocks (arriving through p, or leaving) failed; drops the
  // device, or the peer when that is the device.
  void migration_failed(const std::shared_ptr<peer>& p, std::uint32_t dev, const std::string& why);
  // The adaptive splitter: profiles in, plans out.
  void on_profile(const std::shared_ptr<peer>& p, const wire::Profile& m);
  void maybe_replan(const std::string& why);
  std::vector<profile_book::device_entry> planned_devices() const;
  // The cost model's step time of these devices (those connected) under their current routes.
  double predicted_step(const std::vector<std::uint32_t>& ids);
  void apply_schedule(std::uint64_t round);
  void apply_caps(const std::shared_ptr<peer>& p);
  // Worker: times the server's blocks again when none of them ran here since the last call.
  void reprofile_if_idle();
  core::route route_for_device(bool behind_edge) const;
  transport::message_builder plan_message(std::uint32_t device, bool resplit = false) const;
  void send_global(const std::shared_ptr<peer>& to, std::uint32_t device_id, double acc, double loss);
  void shutdown(const std::string& why);
  std::uint64_t channel_bytes() const;

  // Worker thread.
  void compute_step(std::uint32_t device, const core::route& r, std::uint32_t epoch,
                    std::shared_ptr<transport::outbox> out, transport::message m, bool is_activation,
                    std::shared_ptr<peer> p);
  // Runs f on the worker thread and resumes on the I/O thread with its result.
  // f is a named object of the caller (alive across the co_await).
  template <class F>
  asio::awaitable<std::invoke_result_t<F&>> on_worker(F& f) {
    using R = std::invoke_result_t<F&>;
    // Named, not a temporary in the co_await expression: g++ 12 destroys those twice.
    auto task = [&f]() -> asio::awaitable<R> { co_return f(); };
    co_return co_await asio::co_spawn(work_, std::move(task), asio::use_awaitable);
  }

  server_config c_;
  asio::io_context io_, work_;
  asio::executor_work_guard<asio::io_context::executor_type> work_guard_;
  std::thread worker_;
  asio::steady_timer wake_{io_};
  std::optional<transport::tls_context> tls_;
  std::optional<transport::listener> listener_;
  bool stopping_ = false;
  std::string stop_reason_;

  std::unique_ptr<core::backend> be_;
  core::model_spec model_;
  core::dataset_split data_;
  std::unique_ptr<core::segment_host> host_;      // worker only
  held_steps held_;                               // worker only: steps waiting for migrated blocks
  core::live_profile live_;                       // worker only
  std::map<std::uint32_t, double> step_compute_;  // worker: this step's compute per device
  int n_observed_ = 0;
  int n_observed_mark_ = 0;  // worker: n_observed_ when the last round started
  std::uint32_t profile_batch_ = 0;
  std::uint64_t memory_budget_ = 0;
  std::unique_ptr<profile_book> book_;  // I/O thread
  transport::emulation_schedule schedule_;
  std::vector<transport::emulation_event> link_events_;  // links of this node changed by the schedule
  int n_resplits_ = 0;
  double planner_s_ = 0;
  std::unique_ptr<core::trainer> eval_;  // worker only

  std::vector<std::shared_ptr<peer>> peers_;
  std::map<std::uint32_t, device_state> devices_;
  std::uint32_t plan_epoch_ = 1;
  std::uint64_t round_ = 0;
  bool round_open_ = false;
  std::unique_ptr<core::model_average> avg_;
  std::set<std::uint32_t> edges_done_;
  std::set<std::uint32_t> edges_expected_;
  // Round statistics (I/O thread; the worker adds through posts).
  double loss_sum_ = 0, device_compute_ = 0, edge_compute_ = 0;
  std::uint64_t n_loss_ = 0, n_correct_ = 0, edge_bytes_ = 0;
  std::atomic<double> server_compute_{0};
  round_report last_;
};

}  // namespace cleave::server
