// Re-planning a federation that is training: which devices move and where, the step a device
// costs over a round in which it cut over, the route a device starts on, and the routes in force
// as checkpoint fields. The node that coordinates (the server) feeds these from its members.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cleave/core/model.h"
#include "cleave/split/plan.h"
#include "cleave/split/splitter.h"

namespace cleave::split {

// `hops` as nodes run them on route r: a hop that carries the model's output (the loss's input,
// or the U's top going down) stays f32, whatever codec was chosen for it.
std::vector<core::hop_codecs> exact_output(const route& r, std::vector<core::hop_codecs> hops);

// A device as it trains now.
struct running_device {
  route current;
  route_choice running;  // how it runs its route (micro-batches, each hop's codecs)
  bool held = false;     // may not move now: a re-split pending, or not measured since its last
};
struct resplit_move {
  std::size_t device = 0;  // index into the devices given
  route to;
  std::vector<core::hop_codecs> hops;
  double now_seconds = 0, next_seconds = 0;  // its predicted step before and after
};
struct replan_outcome {
  double planner_seconds = 0;
  std::string no_fit;         // not empty: no plan fits, and why
  resplit_decision decision;  // for the whole federation (policy.min_gain, repay_rounds)
  // With a decision to change: only the devices whose own step gains min_gain (or whose route no
  // longer fits). The others would pay a migration for nothing the federation's step time sees.
  std::vector<resplit_move> moves;
};
// The best plan for `devs` over problem p (the same devices, in order); the held devices stay as
// they run. A device's best route is its own: its cost depends on the others only through how
// many share a node, not on their routes.
// With min_holders > 1 (secure aggregation decodes a block only over that many devices holding
// it), a move is left out when it would leave more blocks held on the device by some but fewer
// than min_holders devices: such blocks' device replicas stay out of the aggregate. All the
// moves are kept when together they add none; otherwise they are taken one by one in order of
// their gain.
replan_outcome replan(const split_problem& p, const std::vector<running_device>& devs, const resplit_policy& policy,
                      int min_holders = 1);

// Whether going from route `from` to `to` takes blocks off the device.
bool takes_off_device(const route& from, const route& to);

// A plan a device ran earlier in a round, until the step of the round at which it cut over.
struct plan_leg {
  route r;
  route_choice choice;
  std::uint64_t until = 0;
};
// One plan a device's steps ran in a round, priced: how many steps, the predicted step under it,
// and the predicted migration that ended it (0 for the plan in force at the round's end).
struct priced_leg {
  route r;
  std::uint64_t steps = 0;
  double step_seconds = 0;
  double migration_seconds = 0;
};
// The plans device `device` ran over a round of `steps` steps, each priced: its legs under their
// plans with the migrations between them, then `current` for the rest at `now_seconds`.
std::vector<priced_leg> price_legs(const split_problem& p, int device, const std::vector<plan_leg>& legs,
                                   const route& current, double now_seconds, std::uint64_t steps);
// Their mean predicted step: every leg's steps and migration over the round's steps.
double mean_step_seconds(const std::vector<priced_leg>& legs, std::uint64_t steps);
inline double mean_step_seconds(const split_problem& p, int device, const std::vector<plan_leg>& legs,
                                const route& current, double now_seconds, std::uint64_t steps) {
  return mean_step_seconds(price_legs(p, device, legs, current, now_seconds, steps), steps);
}

// The fewest bottom blocks that hold a block with parameters (0: no block has any): fewer on a
// device would send its input on only reshaped or pooled, which devices refuse.
int trained_bottom(const core::model_spec& m);

// The route a device starts on: the configured cuts (none: the default ones, deepened to keep
// min_device_blocks on the device). Throws core::error naming `option` and its cuts when the model
// cannot take them or they keep fewer than min_device_blocks on the device.
route starting_route(const core::model_spec& m, bool u_shape, bool behind_edge, const std::vector<int>& cuts,
                     int min_device_blocks, const std::string& option);

// Each device's route in force and its plan epoch, as checkpoint fields "route:ID" and
// "route:ID:epoch", and read back: throws core::error naming a field that is malformed, of
// another shape (U or not) than `u_shape`, or of a plan after `last_epoch`.
struct epoch_route {
  route r;
  std::uint32_t epoch = 0;
};
void write_routes(std::map<std::string, std::string>& meta, const std::map<std::uint32_t, epoch_route>& routes);
std::map<std::uint32_t, epoch_route> read_routes(const std::map<std::string, std::string>& meta, int n_blocks,
                                                 bool u_shape, std::uint32_t last_epoch);

}  // namespace cleave::split
