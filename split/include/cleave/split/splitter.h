// The adaptive splitter's model and planner: what one training step costs under a plan, and
// the cuts, micro-batch count and cut codecs that make it cheapest. Pure computation over
// measured figures (profiles come from the nodes, see profiler.h); the server feeds it and
// applies its answers.
//
// Cost model (one step = one batch of every device, all devices training at once). Device d's
// route is a chain of segments on nodes joined by hops, in path order: segment 0, hop 0,
// segment 1, ..., the last segment (where the loss is). A route that keeps every block on the
// device (off the U) is segment 0 alone, the loss computed there: its T_d is the board's time
// for the whole model, whatever M (route::device_only).
//   segment k: its blocks' forward and backward times on the node running it, times that node's
//     share factor (the server serves all devices at once, an edge the devices behind it:
//     processor sharing, so a node serving k devices gives each 1/k of itself). Empty segments
//     take 0 s (their node relays).
//   hop k (between segments k and k+1, at cut c): the activation up and the gradient down, each
//     encoded_bytes(codec, numel, channels) / bandwidth plus seconds_per_value(codec) * numel of
//     encoding and decoding; numel = cut_bytes[c] / 4, channels = cut_channels[c]; and the
//     link's round trip rtt_k.
// With M micro-batches (a route_choice picks M and the codecs of every hop) the runtime runs the
// device's M bottom forwards back to back, sends each up as it is done, and every other node and
// link direction serves what reaches it in order; a node runs a segment's forward and its
// backward as two passes (the last segment's in one go), and a link's two directions are
// separate resources. One micro-batch passes, in order, the stages (each 1/M of the step's):
//   fwd_0, up_0, fwd_1, up_1, ..., last segment, down_{n-1}, bwd_{n-1}, ..., down_0, bwd_0
// with rtt_k / 2 of latency after each direction of hop k (micro-batches are in flight on a
// link at once: latency delays, it does not occupy). Then
//   T_d = max(P, max_r B_r)
//   P   = sum of the stages + L_d + (M - 1) * max of the stages,   L_d = sum over the hops of rtt
// is the step of a flow shop where every stage has its own resource, and for every resource r
// that serves two or more stages of the route (a node's forward and backward, both device
// segments in U-shape, a link direction that carries a hop's activation and another's gradient
// in U-shape) the busy bound
//   B_r = (one micro-batch's stages and latency before r's first stage) + M * (r's stages)
//         + (one micro-batch's stages and latency after r's last stage).
// Both are lower bounds of the step the runtime's schedule takes; T_d equals it when only the
// device runs two stages (D S, and D E S with an empty edge segment: with all forwards first,
// T = max(M (f + b), P)), and is below it when a middle node's forwards and backwards contend
// (tests/core/splitter_schedule.cpp simulates the schedule). With M = 1 every B_r sums fewer of
// P's terms, so T_d = P, the sequential model: with f32 both ways segments + 2 * cut_bytes /
// bandwidth + rtt per hop.
// A block's forward time is node_costs::forward_seconds; problems that give none take a third of
// block_seconds (a backward pass computes the gradients of the input and of the weights, about
// twice the forward's arithmetic).
//   step time of the plan = max over devices of T_d.
// Memory: a node's budget is shared evenly by the devices it serves (a device's own board is
// all its own); the blocks a device's route puts on a node (both segments where the path
// visits it twice) may not exceed its share. A block counts its fixed bytes and its saved bytes
// for the whole step whatever M: the forward passes of every micro-batch finish before the
// first backward, so all their saved activations are alive at once. Memory is therefore
// independent of the route_choice.
//
// Costs are separable per device, so the best plan is the best route and choice of every device
// on its own. Ties (equal T_d, compared exactly) go to the smallest cuts compared
// lexicographically, then the smallest M, then the codecs compared lexicographically as the
// sequence (hop 0 up, hop 0 down, hop 1 up, ...) in the order of split_problem::codecs.
// plan_best finds that choice exactly (see planner.cpp and pipeline_search.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cleave/core/codec.h"
#include "cleave/split/plan.h"

namespace cleave::split {

struct node_costs {
  std::vector<double> block_seconds;  // per block: forward + backward of one whole step, this node alone
  double memory_budget = 0;           // bytes; 0 = unlimited
  // Per block: the forward part of block_seconds (<= it); empty: a third of it (see above).
  std::vector<double> forward_seconds;
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

// A codec the planner may put on a hop, with its encoding + decoding time per value of the cut
// tensor (both ends together).
struct codec_option {
  core::codec id = core::codec::f32;
  double seconds_per_value = 0;
};
// Each codec `set` allows with its cost on this host (the fastest of three runs over 256 Ki values).
std::vector<codec_option> measure_codecs(const core::codec_set& set);

struct split_problem {
  int n_blocks = 0;
  bool u_shape = false;
  int n_micro_batches = 1;  // the micro-batches of a step when no choice says otherwise
  // Micro-batch counts the planner may choose from (typically 1, 2, 4, 8); empty: {n_micro_batches}.
  std::vector<int> micro_batch_options;
  int batch = 0;  // samples per step; when > 0 every micro-batch count must divide it
  // cut_bytes[c] (c in [0, n_blocks]): bytes of the activation entering block c (c == n_blocks:
  // the model's output) for one whole step; its gradient has the same size.
  std::vector<double> cut_bytes;
  // Per cut (n_blocks + 1 entries): channels of the activation (int8 sends one scale per
  // channel); empty: 1 each.
  std::vector<double> cut_channels;
  // Codecs the planner may choose from, in tie-break order; empty: {f32 at no cost}. topk is
  // for gradients only. f32 is always allowed in a route_choice (at no cost when not listed).
  std::vector<codec_option> codecs;
  float topk_fraction = 0.1f;  // fraction of the values topk keeps
  // Per block: bytes that stay while the block is hosted (parameters, buffers, gradients,
  // optimizer state) and bytes kept for backward during a step.
  std::vector<double> fixed_bytes, saved_bytes;
  node_costs server;
  std::vector<node_costs> edges;
  std::vector<link_costs> edge_links;  // edge e <-> server
  std::vector<device_costs> devices;
  // Blocks every device keeps at the bottom of its route at least (its first cut is >= this):
  // activations of shallow cuts are the easiest to invert to the input. 0: no minimum.
  int min_device_blocks = 0;
};

// Throws core::error naming the first inconsistency (sizes, negative or non-finite values,
// edge indices out of range, micro-batch counts, codecs).
void validate(const split_problem& p);

// The path of tiers of device d under p (D S, D E S, D S D or D E S E D).
std::vector<core::tier> path_of(const split_problem& p, int device);

// How a route runs: its micro-batch count and the codecs of each hop (hops.size() ==
// route.path.size() - 1). The activation codec must allow activations (not topk).
struct route_choice {
  int n_micro_batches = 1;
  std::vector<core::hop_codecs> hops;
  friend bool operator==(const route_choice&, const route_choice&) = default;
};
// p.n_micro_batches and f32 on every hop of a route with `n_hops` hops.
route_choice default_choice(const split_problem& p, std::size_t n_hops);

struct route_cost {
  double seconds = 0;  // T_d
  // Busy time over the whole step: of the nodes (segments) and of the links (hops' bytes and codecs).
  double compute_seconds = 0, transfer_seconds = 0;
  double fill_seconds = 0;        // the sum of one micro-batch's stages + L_d
  double bottleneck_seconds = 0;  // the longest stage
  double busy_seconds = 0;        // max_r B_r (0 with one micro-batch)
  bool feasible = true;           // within every memory share
  std::string why;                // when not feasible: which node's memory is exceeded
};
// T_d of route r run as `choice` for device d, computed directly from the definition above
// (the oracle the planner is tested against). Throws core::error naming a bad route or choice.
route_cost evaluate_route(const split_problem& p, int device, const route& r, const route_choice& choice);
// The same under default_choice (p.n_micro_batches, f32).
route_cost evaluate_route(const split_problem& p, int device, const route& r);

struct plan_cost {
  double step_seconds = 0;  // max over devices
  int slowest_device = -1;
  std::vector<route_cost> devices;
  bool feasible = true;
};
plan_cost evaluate_plan(const split_problem& p, const std::vector<route>& routes,
                        const std::vector<route_choice>& choices);
// The same under default_choice for every route.
plan_cost evaluate_plan(const split_problem& p, const std::vector<route>& routes);

struct split_plan {
  std::vector<route> routes;          // one per device, in the order of p.devices
  std::vector<route_choice> choices;  // one per device: how its route runs
  plan_cost cost;
};
// The cheapest feasible route and choice of every device among the problem's micro-batch
// options and codecs (ties: see above). Throws core::error naming the device when no route
// fits its memory shares.
split_plan plan_best(const split_problem& p);
// The same by trying every route, micro-batch count and codec of every hop of every device
// (tests; small problems only).
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
// Whether to move from the current routes, run as `current_choices`, to `proposed` (its routes
// and choices) under the policy.
resplit_decision decide_resplit(const split_problem& p, const std::vector<route>& current,
                                const std::vector<route_choice>& current_choices, const split_plan& proposed,
                                const resplit_policy& policy);
// The same with the current routes run under default_choice.
resplit_decision decide_resplit(const split_problem& p, const std::vector<route>& current, const split_plan& proposed,
                                const resplit_policy& policy);

}  // namespace cleave::split
