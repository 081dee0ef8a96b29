// The adaptive splitter's model and planner: what one training step costs under a plan, and
// the cuts that make it cheapest. Pure computation over measured figures (profiles come from
// the nodes, see profiler.h); the server feeds it and applies its answers.
//
// Cost model (one step = one batch of every device, all devices training at once):
//   T_d = sum over d's segments of the blocks' step time on the node running them, times that
//         node's share factor (the server serves all devices at once, an edge the devices
//         behind it: processor sharing, so a node serving k devices gives each 1/k of itself)
//       + for every hop between consecutive segments of d's path (also across an empty segment,
//         whose node relays): activation up and gradient down, 2 * cut_bytes / bandwidth,
//         plus one round trip per micro-batch.
//   step time of the plan = max over devices of T_d.
// Memory: a node's budget is shared evenly by the devices it serves (a device's own board is
// all its own); the blocks a device's route puts on a node (both segments where the path
// visits it twice) may not exceed its share. Costs are separable per device, so the best plan
// is the best route of every device on its own; the planner finds it exactly by dynamic
// programming over the chain of blocks and the path of tiers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cleave/split/plan.h"

namespace cleave::split {

struct node_costs {
  std::vector<double> block_seconds;  // per block: forward + backward of one whole step, this node alone
  double memory_budget = 0;           // bytes; 0 = unlimited
};

struct link_costs {
  double bytes_per_second = 0;  // 0 = unlimited
  double rtt_seconds = 0;
};

struct device_costs {
  node_costs board;  // the device's own backend
  int edge = -1;     // index into split_problem::edges; -1: connected straight to the server
  link_costs link;   // device <-> its edge (or the server)
};

struct split_problem {
  int n_blocks = 0;
  bool u_shape = false;
  int n_micro_batches = 1;
  // cut_bytes[c] (c in [0, n_blocks]): bytes of the activation entering block c (c == n_blocks:
  // the model's output) for one whole step; its gradient has the same size.
  std::vector<double> cut_bytes;
  // Per block: bytes that stay while the block is hosted (parameters, buffers, gradients,
  // optimizer state) and bytes kept for backward during a step.
  std::vector<double> fixed_bytes, saved_bytes;
  node_costs server;
  std::vector<node_costs> edges;
  std::vector<link_costs> edge_links;  // edge e <-> server
  std::vector<device_costs> devices;
};

// Throws core::error naming the first inconsistency (sizes, negative or non-finite values,
// edge indices out of range).
void validate(const split_problem& p);

// The path of tiers of device d under p (D S, D E S, D S D or D E S E D).
std::vector<core::tier> path_of(const split_problem& p, int device);

struct route_cost {
  double seconds = 0;  // T_d
  double compute_seconds = 0, transfer_seconds = 0;
  bool feasible = true;  // within every memory share
  std::string why;       // when not feasible: which node's memory is exceeded
};
// T_d of route r for device d, computed directly from the definition above (the oracle the
// planner is tested against).
route_cost evaluate_route(const split_problem& p, int device, const route& r);

struct plan_cost {
  double step_seconds = 0;  // max over devices
  int slowest_device = -1;
  std::vector<route_cost> devices;
  bool feasible = true;
};
plan_cost evaluate_plan(const split_problem& p, const std::vector<route>& routes);

struct split_plan {
  std::vector<route> routes;  // one per device, in the order of p.devices
  plan_cost cost;
};
// The cheapest feasible route of every device (ties: the route with the smallest cuts,
// compared lexicographically). Throws core::error naming the device when no route fits its
// memory shares.
split_plan plan_best(const split_problem& p);
// The same by trying every route of every device (tests; small problems only).
split_plan plan_exhaustive(const split_problem& p);

// Time to move the blocks whose tier changes from `from` to `to` for device d: their fixed bytes
// over the links between the two tiers (relayed through the edge where the path has one),
// plus one round trip per hop.
double migration_seconds(const split_problem& p, int device, const route& from, const route& to);

struct resplit_policy {
  double min_gain = 0.05;   // relative step-time gain below which a plan is kept
  double repay_rounds = 2;  // the gain must repay the migration within this many rounds
  std::int64_t steps_per_round = 50;
};
struct resplit_decision {
  bool change = false;
  double current_seconds = 0, proposed_seconds = 0;  // predicted step times
  double migration_seconds = 0;                      // predicted, all devices
  std::string reason;                                // one line for the log
};
// Whether to move from the current routes to `proposed` under the policy.
resplit_decision decide_resplit(const split_problem& p, const std::vector<route>& current, const split_plan& proposed,
                                const resplit_policy& policy);

}  // namespace cleave::split
