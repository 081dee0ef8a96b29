// The server node's inside, shared by its source files: server_node.cpp (sessions, joins,
// steps, uploads), server_rounds.cpp (the round state machine) and server_resplit.cpp
// (profiles, plans, re-splits).
#pragma once

#include "cleave/server/server_node.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "cleave/backend/registry.h"
#include "cleave/core/checkpoint.h"
#include "cleave/core/trainer.h"
#include "cleave/privacy/secagg.h"
#include "cleave/protocol/protocol.h"
#include "cleave/runtime/executors.h"
#include "cleave/runtime/node_metrics.h"
#include "cleave/runtime/segment_runner.h"
#include "cleave/split/aggregator.h"
#include "cleave/split/profile_book.h"
#include "cleave/split/replica_checks.h"
#include "cleave/split/splitter.h"

namespace cleave::server {

using clock = std::chrono::steady_clock;

class server_node::impl {
 public:
  explicit impl(server_config c) : c_(std::move(c)), ex_("server"), wake_(ex_.io()) {}

  round_report run();
  // Throws core::error naming the first bad setting.
  void check_config() const;
  void load_model();
  void stop() { ex_.stop("stopped"); }
  void stop_on_signals() { ex_.stop_on_signals(); }
  std::vector<float> global_p_, global_b_;

 private:
  struct device_state {
    runtime::session_ptr via;  // the session it is attached through: its own, or its edge's
    bool behind_edge = false;
    bool connected = false;
    runtime::route_state rs;
    std::uint64_t last_step = ~0ULL;  // the last step seen
    bool measured = true;             // has reported a profile since its last re-split
    bool resumes = false;             // continues from the checkpoint resumed (wire::Plan::resume)
    std::string name;                 // from its Hello
    std::uint64_t joined_round = 0;   // the round open when it joined, and when its route last moved
    std::uint64_t moved_round = 0;
    double predicted_step_seconds = 0;  // the cost model's for the last round, see predicted_steps
    // The plans it ran earlier in the open round, each until the step of the round at which it
    // cut over: priced with the one in force for the round's predicted step.
    struct leg {
      split::route route;
      std::vector<core::hop_codecs> hops;
      std::uint64_t until = 0;
    };
    std::vector<leg> legs;
    // The codecs of each hop of its route chosen by the planner, and of an announced re-split
    // (empty: the most compact allowed ones, see cut_of).
    std::vector<core::hop_codecs> hops, next_hops;
  };
  // The round as a state machine: open -> wait for members -> start -> collect -> close and
  // average -> evaluate -> broadcast -> checkpoint. Membership events change `members`.
  enum class phase : std::uint8_t { idle, waiting, collecting, closing };
  struct round_state {
    std::uint64_t number = 0;
    std::uint32_t attempt = 1;  // nobody finished the earlier ones
    phase at = phase::idle;
    clock::time_point t0;
    float lr = 0;
    std::uint64_t bytes0 = 0;                                    // bytes moved when it opened
    std::vector<std::pair<std::uint32_t, split::route>> routes;  // of the devices connected then
    std::vector<std::uint32_t> participants;                     // asked to train
    double train_seconds = 0;                                    // until every replica was in
    std::set<std::uint32_t> members;                             // asked to train and still counted
    std::set<std::uint32_t> done;                                // replicas in
    std::unique_ptr<split::aggregator> avg;
    split::replica_ledger uploaded;  // the blocks each device's uploads covered
    // Parts of uploads whose final part has not come yet: averaged only once all passed the checks.
    struct held_part {
      std::vector<std::uint32_t> devices;
      int first, end;
      double weight;
      std::vector<float> params, buffers;
    };
    std::map<runtime::session_ptr, std::vector<held_part>> held;
    double loss_sum = 0, device_compute = 0, edge_compute = 0, server_compute = 0;
    std::uint64_t n_loss = 0, n_correct = 0, edge_bytes = 0;
    int n_resplits = 0;
    double planner_s = 0;
    std::string refused;  // the last upload refused in this round
    int overran = 0;      // sequential mode: devices counted out at the end of their turn
    // Secure aggregation of the device replicas (server_secagg.cpp).
    struct secure_state {
      std::map<std::uint32_t, privacy::roster_entry> keys;  // advertised this round
      std::optional<privacy::secagg_server> agg;            // once the roster is out
      std::set<std::uint32_t> shared;                       // their shares went out to every member
      std::vector<std::pair<int, int>> ranges;              // the blocks the masked words cover
      std::set<std::uint32_t> masked, revealed;             // uploads and reveals in
      bool masking = false, unmasking = false, unmasked = false;
      int n_aggregated = 0;  // survivors whose blocks are in the aggregate
    } secure;
  };

  // Sessions and membership (I/O thread).
  void on_hello(const runtime::session_ptr& s, const transport::message& hello);
  void on_message(const runtime::session_ptr& s, transport::message m);
  void on_closed(const runtime::session_ptr& s, const std::string& why);
  void register_device(const runtime::session_ptr& via, const wire::Hello& h);
  void device_gone(std::uint32_t id, const std::string& reason);
  // The device a message from s is about, attached through s; nullptr when it left through that
  // very edge (the edge sent it before it knew); throws core::error when s has no business with it.
  device_state* attached(std::uint32_t dev, const runtime::session_ptr& s, const char* what);
  void on_step(const runtime::session_ptr& s, transport::message m);
  void on_replica(const runtime::session_ptr& s, const wire::ReplicaUpload& r);
  // Checks a part of an upload against the sender's plan and steps; throws core::error naming the
  // sender and the fault (the channel closes: its devices are counted out of the round).
  void check_replica(const runtime::session_ptr& s, const std::vector<std::uint32_t>& devs,
                     const wire::ReplicaUpload& r, const protocol::weights_view& w);
  // Secure aggregation (server_secagg.cpp): the messages of its phases, the roster once the
  // round's devices advertised their keys, and after training the masked uploads unmasked into
  // the round's aggregate (device blocks keep the global values when that fails, logged).
  void on_secagg(const runtime::session_ptr& s, const wire::SecAgg& m);
  void post_secagg(std::uint32_t device, const protocol::secagg_desc& d);
  asio::awaitable<void> secure_roster(clock::time_point deadline);
  asio::awaitable<void> secure_aggregate();
  std::vector<std::pair<int, int>> held_ranges(const std::vector<std::uint32_t>& set) const;
  // The unmasked sum of ranges added to the round's aggregate; the error when it cannot be had.
  asio::awaitable<std::string> add_unmasked(const core::flat_layout& lay,
                                            const std::vector<std::pair<int, int>>& ranges);
  // Throws core::error when an upload under secure aggregation carries device blocks in the clear.
  void check_secure_part(const runtime::session_ptr& s, const std::vector<std::uint32_t>& devs,
                         const wire::ReplicaUpload& r);
  // Rounds.
  float round_lr(std::uint64_t r) const;
  asio::awaitable<bool> wait_for_members();
  asio::awaitable<void> drive_rounds();
  asio::awaitable<bool> run_round(std::uint64_t number);
  // Sends device `id` the round's start, to train until `until`.
  void start_training(std::uint32_t id, clock::time_point until);
  // Sequential mode: the round's members train one after another, each in a turn of an equal
  // share of the time left to `deadline`; one that overruns its turn is counted out.
  asio::awaitable<void> take_turns(clock::time_point deadline);
  // A new round: its settings, and the server replicas of the devices connected now installed
  // from the global weights; those still attached afterwards are its participants.
  asio::awaitable<void> open_round(std::uint64_t number);
  // Nobody finished the round: it runs again (and the run stops after futile attempts).
  void abandon_round();
  // Close and average (server replicas of the finished devices + uploads), evaluate, broadcast,
  // checkpoint.
  asio::awaitable<void> close_round();
  void report(const core::eval_report& ev, std::int64_t test_samples);
  // Metrics and the run log (server_metrics.cpp): opened before the rounds (a --run-log that
  // cannot be written is an error then), the links and devices refreshed at every scrape, a
  // round's figures when it closes.
  void open_observers();
  void publish_links_and_devices();
  void observe_round(const round_report& rep);
  // The dashboard (server_dashboard.cpp): its page and state, and what the state is made of (I/O
  // thread), kept for when that thread cannot answer in time.
  void open_dashboard();
  std::string dashboard_state();
  nlohmann::json board() const;
  nlohmann::json board_devices() const;
  nlohmann::json board_links() const;  // the server's own, then those below the edges
  // Compute thread: the global model (uploaded to the evaluation stage), the server replicas'
  // optimizer state of `routes` and `state` (splitter_state's) written to --checkpoint, the
  // previous ones kept; "" or why it failed.
  std::string save_checkpoint(std::uint64_t round, const std::vector<std::pair<std::uint32_t, split::route>>& routes,
                              const std::map<std::string, std::string>& state);
  // I/O thread: the plan epoch, the route in force of every device connected or in `routes` with
  // its epoch, and the splitter's book, as checkpoint fields.
  std::map<std::string, std::string> splitter_state(
      const std::vector<std::pair<std::uint32_t, split::route>>& routes) const;
  // Of a checkpoint being resumed: the routes stored (their devices get them back when they
  // rejoin, until their first round), and the book refilled when splitting adaptively. Throws
  // core::error naming the first malformed field.
  void resume_splitter(const core::checkpoint& ck);
  // Throws core::error when --checkpoint cannot be written (before any training).
  void check_checkpoint_path() const;
  // Before the rounds: the newest readable checkpoint, if any, is resumed from (the next round,
  // the global model, the plan epoch, the run's id, the server replicas' optimizer state);
  // throws core::error naming what differs when it was written under another configuration.
  void resume_or_start();
  // The settings a checkpoint must have been written under to be resumed: name -> value.
  std::vector<std::pair<std::string, std::string>> fingerprint() const;
  // --checkpoint, the one being written, and the kept ones (.1 the newest).
  std::vector<std::filesystem::path> checkpoint_files() const;
  void send_global(const runtime::session_ptr& to, std::uint32_t device_id);
  int n_connected() const;
  // Re-splits: announce a new route, switch at the device's Cutover, receive moved blocks.
  void propose(std::uint32_t device, const split::route& r, const std::vector<core::hop_codecs>& hops,
               const std::string& why);
  void on_cutover(const runtime::session_ptr& s, const wire::Cutover& c);
  void on_migrate(const runtime::session_ptr& s, transport::message m);
  // A device's compute failed here (bad blocks or steps it or its edge sent): the device's
  // own session closes, or only that device is dropped when an edge sent it.
  void device_failed(const runtime::session_ptr& s, std::uint32_t dev, const std::string& why);
  // The adaptive splitter: profiles in, plans out.
  void on_profile(const runtime::session_ptr& s, const wire::Profile& m);
  void maybe_replan(const std::string& why);
  std::vector<split::profile_book::device_entry> planned_devices() const;
  // The cost model's step of each device of `ids` training together (sharing the server and
  // their edges as in a round), and of the slowest: empty or 0 without a profile book. A device
  // that cut over during the round is priced per step under the plan it ran then, plus the
  // migrations, all with the profiles of now.
  std::map<std::uint32_t, double> predicted_steps(const std::set<std::uint32_t>& ids);
  double predicted_step(const std::set<std::uint32_t>& ids);
  void publish_profile();  // compute thread: the server's live profile to the book
  split::route route_for_device(bool behind_edge) const;
  transport::message_builder plan_message(std::uint32_t device, bool resplit = false) const;
  // How a device on route r crosses its cuts (micro-batches, codecs per hop).
  // hops: the planner's choice for r (null or not one per hop: the most compact allowed codecs).
  protocol::cut_settings cut_of(const split::route& r, const std::vector<core::hop_codecs>* hops = nullptr) const;
  // How the devices in `devs` run today: the configured micro-batches, their hops' codecs.
  std::vector<split::route_choice> running_choices(const std::vector<split::profile_book::device_entry>& devs) const;
  // What the planner may choose from besides the cuts: codecs (with their measured host cost),
  // channels at every cut.
  void add_choices(split::split_problem& p) const;
  void measure_codecs();
  std::vector<split::codec_option> codec_options_;

  server_config c_;
  runtime::executors ex_;
  runtime::signal wake_;  // membership changed, a replica came in, a round ended
  // Rounds in a row in which uploads came and every one was refused: the run cannot go on.
  int futile_rounds_ = 0;
  static constexpr int max_futile_rounds = 3;
  std::optional<transport::tls_context> tls_;
  std::optional<runtime::acceptor> acceptor_;

  std::unique_ptr<core::backend> be_;
  core::model_spec model_;
  std::shared_ptr<const core::data_source> test_;  // evaluates the global model
  std::optional<runtime::segment_runner> runner_;  // compute thread
  std::unique_ptr<core::trainer> eval_;            // compute thread
  int n_stepped_ = 0;                              // compute thread
  std::uint64_t memory_budget_ = 0;
  std::unique_ptr<split::profile_book> book_;
  std::optional<runtime::link_schedule> schedule_;

  std::map<std::uint32_t, device_state> devices_;
  // Per open edge session: the devices that left through it (what it still sends for them is late).
  std::map<runtime::session_ptr, std::set<std::uint32_t>> left_via_;
  std::uint32_t plan_epoch_ = 1;
  round_state round_;
  round_report last_;
  std::shared_ptr<const core::data_source> eval_subset_;  // --eval-samples of the test split
  std::ofstream run_log_;
  std::vector<nlohmann::json> history_;  // one row per round closed, for the dashboard's curves
  std::mutex board_mu_;
  std::string board_cache_ = "{}";
  std::uint64_t run_id_ = 0;  // this run's (kept when resumed)
  std::uint64_t first_round_ = 1;
  // From the checkpoint resumed: each device's server replicas' optimizer state, installed in
  // its first round.
  std::map<std::uint32_t, std::vector<runtime::segment_runner::optimizer_state>> resumed_opt_;
  // From the checkpoint resumed, when splitting adaptively: each device's route and its plan
  // epoch, given back when it rejoins until its first round opens.
  struct resumed_route {
    split::route route;
    std::uint32_t epoch = 0;
  };
  std::map<std::uint32_t, resumed_route> resumed_routes_;

 public:
  std::string checkpoint_failure_;  // the last failed checkpoint write
};

}  // namespace cleave::server
