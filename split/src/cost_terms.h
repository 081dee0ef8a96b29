// Terms of the cost model shared by the oracle (splitter.cpp) and the planner (planner.cpp):
// both must compute every cost with the same code, in the same order (see splitter.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cleave/split/splitter.h"

namespace cleave::split::detail {

inline constexpr double unlimited = std::numeric_limits<double>::infinity();

inline const device_costs& dev_of(const split_problem& p, int d) {
  return p.devices[static_cast<std::size_t>(d)];
}

// How many devices a node on d's path serves.
inline double share_of(const split_problem& p, int d, core::tier t) {
  switch (t) {
    case core::tier::device:
    case core::tier::admin:  // runs no blocks
      return 1.0;
    case core::tier::server:
      return static_cast<double>(p.devices.size());
    case core::tier::edge: {
      const int e = dev_of(p, d).edge;
      return static_cast<double>(
          std::count_if(p.devices.begin(), p.devices.end(), [e](const device_costs& x) { return x.edge == e; }));
    }
  }
  return 1.0;
}

inline const node_costs& node_of(const split_problem& p, int d, core::tier t) {
  switch (t) {
    case core::tier::device:
      return dev_of(p, d).board;
    case core::tier::edge:
      return p.edges[static_cast<std::size_t>(dev_of(p, d).edge)];
    case core::tier::server:
    case core::tier::admin:  // runs no blocks
      break;
  }
  return p.server;
}

// The link between two neighbouring tiers of d's path.
inline const link_costs& link_between(const split_problem& p, int d, core::tier a, core::tier b) {
  if (a == core::tier::device || b == core::tier::device) return dev_of(p, d).link;
  return p.edge_links[static_cast<std::size_t>(dev_of(p, d).edge)];
}

// A node's memory share for one device; budget 0 = unlimited.
inline double cap_of(double budget, double share) {
  return budget > 0 ? budget / share : unlimited;
}

// The cut tensor at cut c: values (cut_bytes are f32) and channels.
inline double numel_at(const split_problem& p, int cut) {
  return p.cut_bytes[static_cast<std::size_t>(cut)] / 4.0;
}
inline double channels_at(const split_problem& p, int cut) {
  return p.cut_channels.empty() ? 1.0 : p.cut_channels[static_cast<std::size_t>(cut)];
}

// Forward seconds of block i on node n: measured, or a third of the block's time when the problem
// gives none (see splitter.h); the backward is the rest.
inline double forward_of(const node_costs& n, std::size_t i) {
  return n.forward_seconds.empty() ? n.block_seconds[i] / 3.0 : n.forward_seconds[i];
}
inline double backward_of(const node_costs& n, std::size_t i) {
  return n.block_seconds[i] - forward_of(n, i);
}

// ---- Stage times (per micro-batch). Every caller prices a stage with these, in this order. ----

// A segment's `seconds` (its blocks' sum from the first block upward, times the node's share)
// split into m micro-batches: the whole segment, or its forward or backward pass alone.
inline double segment_stage(double seconds, int m) {
  return seconds / static_cast<double>(m);
}

// The M-independent part of one direction of a hop: the encoded bytes over the link plus the
// codec's compute (seconds_per_value * numel).
inline double direction_total(const link_costs& l, double encoded_bytes, double codec_seconds) {
  const double wire = l.bytes_per_second > 0 ? encoded_bytes / l.bytes_per_second : 0.0;
  return wire + codec_seconds;
}
// The same per micro-batch.
inline double direction_seconds(double total, int m) {
  return total / static_cast<double>(m);
}

// A hop's two directions together: its term of the sum of one micro-batch's stages.
inline double hop_stage(double up, double down) {
  return up + down;
}

// The flow shop's step from the sum of one micro-batch's stages and the longest stage, before
// the path's latency.
inline double pipeline_seconds(double sum, double top, int m) {
  return sum + static_cast<double>(m - 1) * top;
}

// ---- T of a route (splitter.h), from its terms. The oracle and the planner both call time_of. ----

// One route at m micro-batches, per micro-batch, in path order. seg: a segment's forward and
// backward together; fwd, bwd: its two passes (unused for the last segment, whose node runs both
// in one go); up, down: a hop's directions; rtt: its link's round trip.
struct route_terms {
  int n_segments = 0, m = 1;
  bool u_shape = false;
  std::array<double, 5> seg{}, fwd{}, bwd{};
  std::array<double, 4> up{}, down{}, rtt{};
};

struct route_time {
  double sum = 0;       // seg_0 + (hop_0 + (seg_1 + ... + seg_last)), hop = up + down
  double top = 0;       // the longest stage
  double latency = 0;   // L: the round trips, added from the top of the path down
  double pipeline = 0;  // P = sum + (m - 1) * top + L
  double busy = 0;      // the largest busy bound (0 when m == 1)
  double seconds = 0;   // T = max(P, busy)
};

// The longest stage: a pass of a segment below the last, the last segment, a hop's direction.
inline double terms_top(const route_terms& t) {
  const int last = t.n_segments - 1;
  double top = t.seg[static_cast<std::size_t>(last)];
  for (std::size_t k = 0; k < static_cast<std::size_t>(last); ++k)
    top = std::max({top, t.fwd[k], t.bwd[k], t.up[k], t.down[k]});
  return top;
}

// Busy bounds of the nodes: segment k's node for k below the last (and, in U-shape, up to the
// middle: the device and the edge hold two segments, mirrored). Its stages start after one
// micro-batch's segments and hops below it with their round trips, and end before the same
// coming back down.
inline double node_bounds(const route_terms& t) {
  const int last = t.n_segments - 1, n_nodes = t.u_shape ? last / 2 + 1 : last;
  const double m = static_cast<double>(t.m);
  double most = 0, below = 0, below_rtt = 0;
  for (int k = 0; k < n_nodes; ++k) {
    const auto i = static_cast<std::size_t>(k), mirror = static_cast<std::size_t>(last - k);
    const double own = t.u_shape && k < last - k ? t.seg[i] + t.seg[mirror] : t.seg[i];
    most = std::max(most, (below + below_rtt) + m * own);
    below = (below + t.seg[i]) + hop_stage(t.up[i], t.down[i]);
    below_rtt = below_rtt + t.rtt[i];
  }
  return most;
}

// The busy bound of the link direction that carries hop a's activation and hop b's gradient
// (U-shape: both directions of a link serve two hops). Before a's activation: the forwards of
// segments 0..a and the hops below with half their round trip; after b's gradient: the
// backwards of segments b..0 and the hops below b, with half a round trip per hop from b down.
inline double link_bound(const route_terms& t, std::size_t a, std::size_t b) {
  double head = 0, tail = 0;
  for (std::size_t j = 0; j <= a; ++j) head = head + t.fwd[j];
  for (std::size_t j = 0; j < a; ++j) head = head + (t.up[j] + t.rtt[j] / 2);
  for (std::size_t j = 0; j <= b; ++j) tail = tail + (t.bwd[j] + t.rtt[j] / 2);
  for (std::size_t j = 0; j < b; ++j) tail = tail + t.down[j];
  return (head + tail) + static_cast<double>(t.m) * (t.up[a] + t.down[b]);
}

inline double link_bounds(const route_terms& t) {
  if (!t.u_shape) return 0;  // every link direction serves one stage
  const auto n_hops = static_cast<std::size_t>(t.n_segments - 1);
  double most = 0;
  for (std::size_t k = 0; k < n_hops - 1 - k; ++k)
    most = std::max({most, link_bound(t, k, n_hops - 1 - k), link_bound(t, n_hops - 1 - k, k)});
  return most;
}

// T from the terms. Monotone in every term (IEEE addition, multiplication by a number >= 0 and
// max are): a bound computed from lower bounds of the terms is a lower bound of T.
inline route_time time_of(const route_terms& t) {
  route_time r;
  const int last = t.n_segments - 1;
  r.sum = t.seg[static_cast<std::size_t>(last)];
  for (std::size_t k = static_cast<std::size_t>(last); k-- > 0;)
    r.sum = t.seg[k] + (hop_stage(t.up[k], t.down[k]) + r.sum);
  r.top = terms_top(t);
  for (std::size_t k = static_cast<std::size_t>(last); k-- > 0;) r.latency = t.rtt[k] + r.latency;
  r.pipeline = pipeline_seconds(r.sum, r.top, t.m) + r.latency;
  // With one micro-batch every busy bound adds up fewer of P's terms: T is P, the sequential sum.
  if (t.m > 1) r.busy = std::max(node_bounds(t), link_bounds(t));
  r.seconds = std::max(r.pipeline, r.busy);
  return r;
}

// The micro-batch counts the planner chooses from, ascending (the tie-break order).
inline std::vector<int> micro_options(const split_problem& p) {
  std::vector<int> m = p.micro_batch_options.empty() ? std::vector<int>{p.n_micro_batches} : p.micro_batch_options;
  std::sort(m.begin(), m.end());
  return m;
}

// The codecs the planner chooses from, in tie-break order.
inline std::vector<codec_option> codec_options(const split_problem& p) {
  return p.codecs.empty() ? std::vector<codec_option>{codec_option{}} : p.codecs;
}

// Codec c's direction at cut `cut` of p over link l, per micro-batch.
inline double direction_seconds(const split_problem& p, const link_costs& l, const codec_option& c, int cut, int m) {
  const double numel = numel_at(p, cut);
  const double bytes = core::encoded_bytes(c.id, numel, channels_at(p, cut), p.topk_fraction);
  return direction_seconds(direction_total(l, bytes, c.seconds_per_value * numel), m);
}

// Throw core::error naming what is wrong with a route or a choice of device d (p is valid).
void check_route(const split_problem& p, int d, const route& r);
void check_choice(const split_problem& p, int d, const route& r, const route_choice& c);
// The option of codec c: from p.codecs, or f32 at no cost when not listed; nullptr otherwise.
const codec_option* find_codec(const split_problem& p, core::codec c);

// "no route fits": names the device and what it needs at least (lower bounds of every route).
[[noreturn]] void throw_infeasible(const split_problem& p, int d);
// T_d of a checked route and choice, straight from the definition (splitter.cpp).
route_cost evaluate_checked(const split_problem& p, int d, const route& r, const route_choice& c);
// The cost of every device's route and the federation's step (routes and choices already checked).
plan_cost assemble(const split_problem& p, const std::vector<route>& routes, const std::vector<route_choice>& choices);
// Whether route r of device d fits in its memory shares, and if not which nodes it exceeds.
bool fits_memory(const split_problem& p, int d, const route& r, std::string* why);
// Every valid cut vector of d's path, in lexicographic order.
void each_cuts(int n, bool u_shape, std::size_t n_cuts, std::vector<int>& cuts,
               const std::function<void(const std::vector<int>&)>& f);

}  // namespace cleave::split::detail
