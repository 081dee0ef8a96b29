// Terms of the cost model shared by the oracle (splitter.cpp) and the planner (planner.cpp):
// both must compute every cost with the same code, in the same order (see splitter.cpp).
#pragma once

#include <algorithm>
#include <limits>
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

// Activation up and gradient down, plus one round trip per micro-batch.
inline double hop_seconds(const link_costs& l, double bytes, int n_micro_batches) {
  const double wire = l.bytes_per_second > 0 ? 2.0 * bytes / l.bytes_per_second : 0.0;
  return wire + static_cast<double>(n_micro_batches) * l.rtt_seconds;
}

// "no route fits": names the device and what it needs at least (lower bounds of every route).
[[noreturn]] void throw_infeasible(const split_problem& p, int d);
// The cost of every device's route and the federation's step (routes already checked).
plan_cost assemble(const split_problem& p, const std::vector<route>& routes);

}  // namespace cleave::split::detail
