// The server's plans: each device's route and how it crosses its cuts, the plan epoch, and the
// adaptive splitter (profiles in, plans out, re-splits announced), with its part of a checkpoint.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cleave/core/checkpoint.h"
#include "cleave/protocol/protocol.h"
#include "cleave/runtime/executors.h"
#include "cleave/server/server_node.h"
#include "cleave/split/profile_book.h"
#include "cleave/split/replan.h"
#include "cleave/split/splitter.h"
#include "membership.h"

namespace cleave::server {

// Why a device is to move: for the log, and the cost model's step of the device on its route
// and on the new one (0: not priced, as for a forced move).
struct move_why {
  std::string text;
  double step_before = 0, step_after = 0;
};

// A re-split announced (the n-th of the run): when (Unix seconds), of which device, from and to
// which route, and why.
struct cut_event {
  std::uint64_t n = 0;
  double at = 0;
  std::uint32_t device = 0;
  std::string from, to;
  move_why why;
};

class splitter {
 public:
  splitter(const server_config& c, const core::model_spec& m, membership& members, runtime::executors& ex)
      : c_(c), model_(m), members_(members), ex_(ex) {}

  // Splitting adaptively from the server's own profile (before anyone joins: the first plan is
  // informed); without this call the configured cuts stay.
  void start(split::node_profile server);
  const split::profile_book* book() const { return book_.get(); }
  void set_server_profile(split::node_profile p);
  std::uint32_t epoch() const { return epoch_; }
  void set_run(std::uint64_t run_id) { run_id_ = run_id; }

  // The configured route of a device joining directly or behind an edge; throws core::error when
  // the configured cuts break --min-device-blocks.
  split::route route_for_device(bool behind_edge) const;
  // Device `id` joins (its state fresh in membership): its route, the one it had at the checkpoint
  // resumed when it rejoins as it was. Returns what to add to the log line.
  std::string place(std::uint32_t id, device_state& d);
  transport::message_builder plan_message(std::uint32_t device, bool resplit = false) const;
  // How a device on route r crosses its cuts; hops: the planner's choice for r (null or not one
  // per hop: the most compact allowed codecs).
  protocol::cut_settings cut_of(const split::route& r, const std::vector<core::hop_codecs>* hops = nullptr) const;

  // A profile from s (a device's own, relayed by its edge, or an edge's); then maybe a re-plan.
  // Returns the planner's seconds (0: it did not search).
  double on_profile(const runtime::session_ptr& s, const wire::Profile& m,
                    const std::list<runtime::session_ptr>& sessions);
  // Re-plans when a device may gain enough; the planner's seconds.
  double maybe_replan(const std::string& why, const std::list<runtime::session_ptr>& sessions);
  // Announces a new route for a device. While `in_round` says a round trains (set under secure
  // aggregation), a route that takes blocks off the device waits for the next round's opening
  // (release_deferred): a device's in-round state never reaches another tier in the clear.
  void propose(std::uint32_t device, const split::route& r, const std::vector<core::hop_codecs>& hops,
               const move_why& why);
  // The re-splits announced, oldest first (the newest max_cut_events).
  const std::deque<cut_event>& cut_events() const { return cuts_; }
  static constexpr std::size_t max_cut_events = 4096;
  void defer_off_device_moves_while(std::function<bool()> in_round) { in_round_ = std::move(in_round); }
  void release_deferred();
  // Device d cut over at `step` to its announced plan (epoch) in round `round` (`leg`: during it);
  // returns the route it left.
  split::route cut_over(device_state& d, std::uint32_t epoch, std::uint64_t step, std::uint64_t round, bool leg);

  // The cost model's step of each device of `ids` training together, and of the slowest (0: no
  // profiles). A device that cut over during the round is priced per step under each plan it ran.
  // The cost model's mean step of each of devices `ids` over the round so far (and into `legs`,
  // those of devices that ran more than one plan in it).
  std::map<std::uint32_t, double> predicted_steps(const std::set<std::uint32_t>& ids,
                                                  std::vector<round_report::leg>* legs = nullptr);
  double predicted_step(const std::set<std::uint32_t>& ids, std::vector<round_report::leg>* legs = nullptr);

  // Checkpoint fields: the plan epoch, the route in force of every device connected or in
  // `routes`, and the book; and reading them back (throws core::error naming a bad field).
  std::map<std::string, std::string> state(const std::vector<std::pair<std::uint32_t, split::route>>& routes) const;
  void resume(const core::checkpoint& ck, std::uint32_t epoch);
  bool resumes(std::uint32_t id) const { return resumed_routes_.count(id) > 0; }
  void round_opened(std::uint32_t id) { resumed_routes_.erase(id); }
  std::string resumed_text() const;  // the book and routes resumed, for the log

 private:
  std::vector<split::profile_book::device_entry> planned_devices() const;
  std::vector<split::route_choice> running_choices(const std::vector<split::profile_book::device_entry>& devs) const;
  void add_choices(split::split_problem& p) const;
  void measure_codecs();

  const server_config& c_;
  const core::model_spec& model_;
  membership& members_;
  runtime::executors& ex_;
  std::unique_ptr<split::profile_book> book_;
  std::vector<split::codec_option> codec_options_;
  std::uint32_t epoch_ = 1;
  std::uint64_t run_id_ = 0;
  // From the checkpoint resumed, when splitting adaptively: each device's route and its plan
  // epoch, given back when it rejoins until its first round opens.
  std::map<std::uint32_t, split::epoch_route> resumed_routes_;
  std::function<bool()> in_round_;
  struct deferred_move {
    split::route to;
    std::vector<core::hop_codecs> hops;
    move_why why;
  };
  std::map<std::uint32_t, deferred_move> deferred_;
  std::deque<cut_event> cuts_;
  std::uint64_t n_cuts_ = 0;
};

}  // namespace cleave::server
