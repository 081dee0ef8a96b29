// Terms of the cost model shared by the oracle (splitter.cpp) and the planner (planner.cpp):
// both must compute every cost with the same code, in the same order (see splitter.cpp).
#pragma once

#include <algorithm>
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

// ---- Stage times (per micro-batch). Every caller prices a stage with these, in this order. ----

// A segment of `seconds` (its blocks' sum times the node's share) split into m micro-batches.
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

// A hop's stage from its two directions. Its latency is not part of the stage: micro-batches
// are in flight on a link at once, so it delays the pipeline's fill only (path_latency).
inline double hop_stage(double up, double down) {
  return up + down;
}

// The round trips of d's path (one per hop, added from the top of the path down): what the
// links' latency adds to every step, whatever the cuts, M and codecs.
inline double path_latency(const split_problem& p, int d, const std::vector<core::tier>& path) {
  double sum = 0;
  for (std::size_t k = path.size() - 1; k-- > 0;) sum = link_between(p, d, path[k], path[k + 1]).rtt_seconds + sum;
  return sum;
}

// The pipeline's step time from its stages' sum (added from the last stage down, see
// splitter.cpp) and their maximum, before the path's latency.
inline double pipeline_seconds(double sum, double bottleneck, int m) {
  return sum + static_cast<double>(m - 1) * bottleneck;
}

// T of stages s_0 .. s_{n-1} in path order: s_0 + (s_1 + (... + s_{n-1})) + (m - 1) * max.
inline double stages_seconds(const double* s, std::size_t n, int m) {
  double sum = s[n - 1], top = s[n - 1];
  for (std::size_t j = n - 1; j-- > 0;) sum = s[j] + sum, top = std::max(top, s[j]);
  return pipeline_seconds(sum, top, m);
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
