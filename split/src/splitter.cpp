// The adaptive splitter's cost model (evaluate_route, the oracle), the exhaustive search that
// checks the planner (planner.cpp), problem validation and the re-split policy.
#include "cleave/split/splitter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cleave/core/error.h"
#include "cost_terms.h"

namespace cleave::split {

using namespace detail;

// Floating-point discipline. plan_best and evaluate_route must give bit-identical costs, or a tie
// (zero-cost blocks, integer-valued profiles) could be broken differently by the planner and by the
// exhaustive search. So both:
//   - sum a segment's blocks from its first block upward, starting at 0, then multiply by the share;
//   - price a hop with hop_seconds();
//   - add a route's terms from the top of the path down:
//       T = seg_0 + (hop_0 + (seg_1 + (hop_1 + ... + seg_last)))
//     which is the order a dynamic programme over suffixes accumulates in;
//   - sum a node's memory per segment the same way, then the segments in path order.
// IEEE addition is monotone (a <= b implies fl(a + x) <= fl(b + x)), so the least fl(a + s) over
// suffixes s is fl(a + least s): minimising suffix by suffix is exact, also in floating point. This
// file is compiled with -ffp-contract=off so that no multiply-add is fused in one place only.

namespace {

std::string bytes_str(double b) {
  if (std::isinf(b)) return "unlimited";
  if (b < 1024.0) return fmt::format("{:.0f} B", b);
  if (b < 1024.0 * 1024.0) return fmt::format("{:.3g} KiB", b / 1024.0);
  if (b < 1024.0 * 1024.0 * 1024.0) return fmt::format("{:.3g} MiB", b / (1024.0 * 1024.0));
  return fmt::format("{:.3g} GiB", b / (1024.0 * 1024.0 * 1024.0));
}

std::string ms_str(double s) {
  return fmt::format("{:.1f} ms", s * 1e3);
}

void check_route(const split_problem& p, int d, const route& r) {
  const auto want = path_of(p, d);
  if (r.path != want) {
    auto names = [](const std::vector<core::tier>& path) {
      std::string s;
      for (auto t : path) s += (s.empty() ? "" : " ") + std::string(core::tier_name(t));
      return s;
    };
    throw core::error("route for device " + std::to_string(d) + ": path '" + names(r.path) + "', expected '" +
                      names(want) + "'");
  }
  if (r.n_blocks != p.n_blocks)
    throw core::error("route for device " + std::to_string(d) + ": " + std::to_string(r.n_blocks) +
                      " blocks, the model has " + std::to_string(p.n_blocks));
  try {
    make_route(p.u_shape, dev_of(p, d).edge >= 0, r.cuts, p.n_blocks);
  } catch (const core::error& e) {
    throw core::error("route for device " + std::to_string(d) + ": " + e.what());
  }
}

// The oracle: T_d straight from the definition (see splitter.h). p and r are already checked.
route_cost evaluate_checked(const split_problem& p, int d, const route& r) {
  route_cost out;
  std::vector<double> terms;  // seg_0, hop_0, seg_1, ..., seg_last
  for (int k = 0; k < r.n_segments(); ++k) {
    const core::tier t = r.path[static_cast<std::size_t>(k)];
    const node_costs& node = node_of(p, d, t);
    double sum = 0;
    for (int i = r.begin(k); i < r.end(k); ++i) sum += node.block_seconds[static_cast<std::size_t>(i)];
    const double seg = sum * share_of(p, d, t);
    terms.push_back(seg);
    out.compute_seconds += seg;
    if (k + 1 < r.n_segments()) {
      const auto& link = link_between(p, d, t, r.path[static_cast<std::size_t>(k + 1)]);
      const double hop = hop_seconds(link, p.cut_bytes[static_cast<std::size_t>(r.end(k))], p.n_micro_batches);
      terms.push_back(hop);
      out.transfer_seconds += hop;
    }
  }
  out.seconds = terms.back();
  for (std::size_t j = terms.size() - 1; j-- > 0;) out.seconds = terms[j] + out.seconds;

  for (core::tier t : {core::tier::device, core::tier::edge, core::tier::server}) {
    const auto segs = r.segments_on(t);
    if (segs.empty()) continue;
    double bytes = 0;
    for (int k : segs) {
      double sum = 0;
      for (int i = r.begin(k); i < r.end(k); ++i)
        sum += p.fixed_bytes[static_cast<std::size_t>(i)] + p.saved_bytes[static_cast<std::size_t>(i)];
      bytes += sum;
    }
    const double cap = cap_of(node_of(p, d, t).memory_budget, share_of(p, d, t));
    if (bytes > cap) {
      out.feasible = false;
      std::string node = t == core::tier::device ? "device board"
                         : t == core::tier::edge ? "edge " + std::to_string(dev_of(p, d).edge) + " share"
                                                 : "server share";
      out.why += (out.why.empty() ? "" : "; ") + node + " needs " + bytes_str(bytes) + " of " + bytes_str(cap);
    }
  }
  return out;
}

// Every valid cut vector of d's path, in lexicographic order.
template <class F>
void each_cuts(int n, bool u_shape, std::size_t n_cuts, std::vector<int>& cuts, F&& f) {
  if (cuts.size() == n_cuts) {
    f(cuts);
    return;
  }
  const int from = cuts.empty() ? 1 : cuts.back();
  const int to = u_shape && cuts.size() + 1 == n_cuts ? n - 1 : n;
  for (int c = from; c <= to; ++c) {
    cuts.push_back(c);
    each_cuts(n, u_shape, n_cuts, cuts, f);
    cuts.pop_back();
  }
}

void check_finite(double v, const std::string& what) {
  if (!std::isfinite(v) || v < 0)
    throw core::error("split problem: " + what + " is " + fmt::format("{}", v) + " (must be finite and >= 0)");
}

void check_values(const std::vector<double>& v, std::size_t want, const std::string& what) {
  if (v.size() != want)
    throw core::error("split problem: " + what + " has " + std::to_string(v.size()) + " entries, expected " +
                      std::to_string(want));
  for (std::size_t i = 0; i < v.size(); ++i) check_finite(v[i], what + "[" + std::to_string(i) + "]");
}

void check_link(const link_costs& l, const std::string& what) {
  check_finite(l.bytes_per_second, what + ".bytes_per_second");
  check_finite(l.rtt_seconds, what + ".rtt_seconds");
}

void check_node(const node_costs& nc, std::size_t n, const std::string& what) {
  check_values(nc.block_seconds, n, what + "block_seconds");
  check_finite(nc.memory_budget, what + "memory_budget");
}

void check_device_index(const split_problem& p, int d) {
  if (d < 0 || static_cast<std::size_t>(d) >= p.devices.size())
    throw core::error("split problem: device " + std::to_string(d) + " out of range (" +
                      std::to_string(p.devices.size()) + " devices)");
}

double migration_checked(const split_problem& p, int d, const route& from, const route& to) {
  const auto& dev = dev_of(p, d);
  const bool has_edge = dev.edge >= 0;
  double device_bytes = 0, edge_bytes = 0;
  bool device_used = false, edge_used = false;
  for (int i = 0; i < p.n_blocks; ++i) {
    const core::tier a = tier_of_block(from, i), b = tier_of_block(to, i);
    if (a == b) continue;
    const double bytes = p.fixed_bytes[static_cast<std::size_t>(i)];
    if ((a == core::tier::device) != (b == core::tier::device)) device_used = true, device_bytes += bytes;
    if (has_edge && (a == core::tier::server) != (b == core::tier::server)) edge_used = true, edge_bytes += bytes;
  }
  auto over = [](const link_costs& l, double bytes) {
    return (l.bytes_per_second > 0 ? bytes / l.bytes_per_second : 0.0) + l.rtt_seconds;
  };
  double s = 0;
  if (device_used) s += over(dev.link, device_bytes);
  if (edge_used) s += over(p.edge_links[static_cast<std::size_t>(dev.edge)], edge_bytes);
  return s;
}

}  // namespace

namespace detail {

// "no route fits": names the device and what it needs at least (lower bounds of every route).
[[noreturn]] void throw_infeasible(const split_problem& p, int d) {
  const auto path = path_of(p, d);
  const std::size_t n = static_cast<std::size_t>(p.n_blocks);
  auto m = [&](std::size_t i) { return p.fixed_bytes[i] + p.saved_bytes[i]; };
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) total += m(i);
  const double board_need = m(0) + (p.u_shape ? m(n - 1) : 0.0);
  std::string shares;
  double have = 0;
  for (core::tier t : {core::tier::device, core::tier::edge, core::tier::server}) {
    if (std::find(path.begin(), path.end(), t) == path.end()) continue;
    const double cap = cap_of(node_of(p, d, t).memory_budget, share_of(p, d, t));
    have += cap;
    shares += (shares.empty() ? "" : ", ") +
              (t == core::tier::device ? std::string("board")
               : t == core::tier::edge ? "edge " + std::to_string(dev_of(p, d).edge) + " share"
                                       : std::string("server share")) +
              " " + bytes_str(cap);
  }
  std::string what = "split problem: device " + std::to_string(d) + ": no route fits its memory (" + shares + "): ";
  const double board = cap_of(dev_of(p, d).board.memory_budget, 1.0);
  if (board_need > board)
    what += "its board needs at least " + bytes_str(board_need) + " for the " +
            (p.u_shape ? "first and last blocks" : "first block");
  else if (total > have)
    what += "it needs at least " + bytes_str(total) + " along its path (every block's fixed and saved bytes)";
  else
    what += "the blocks (" + bytes_str(total) + " at least in all, " + bytes_str(board_need) +
            " at least on the board) do not pack into these shares at any cut";
  throw core::error(what);
}

plan_cost assemble(const split_problem& p, const std::vector<route>& routes) {
  plan_cost out;
  for (std::size_t d = 0; d < routes.size(); ++d) {
    out.devices.push_back(evaluate_checked(p, static_cast<int>(d), routes[d]));
    const auto& c = out.devices.back();
    out.feasible = out.feasible && c.feasible;
    if (out.slowest_device < 0 || c.seconds > out.step_seconds) {
      out.step_seconds = c.seconds;
      out.slowest_device = static_cast<int>(d);
    }
  }
  return out;
}

}  // namespace detail

void validate(const split_problem& p) {
  if (p.n_blocks < 1)
    throw core::error("split problem: n_blocks is " + std::to_string(p.n_blocks) + ", needs at least 1");
  if (p.u_shape && p.n_blocks < 2)
    throw core::error(
        "split problem: u_shape needs at least 2 blocks (the device holds the first and the last), n_blocks is " +
        std::to_string(p.n_blocks));
  if (p.n_micro_batches < 1)
    throw core::error("split problem: n_micro_batches is " + std::to_string(p.n_micro_batches) + ", needs at least 1");
  const std::size_t n = static_cast<std::size_t>(p.n_blocks);
  check_values(p.cut_bytes, n + 1, "cut_bytes");
  check_values(p.fixed_bytes, n, "fixed_bytes");
  check_values(p.saved_bytes, n, "saved_bytes");
  check_node(p.server, n, "server.");
  for (std::size_t e = 0; e < p.edges.size(); ++e) check_node(p.edges[e], n, "edge " + std::to_string(e) + ": ");
  if (p.edge_links.size() != p.edges.size())
    throw core::error("split problem: edge_links has " + std::to_string(p.edge_links.size()) + " entries, expected " +
                      std::to_string(p.edges.size()) + " (one per edge)");
  for (std::size_t e = 0; e < p.edge_links.size(); ++e)
    check_link(p.edge_links[e], "edge_links[" + std::to_string(e) + "]");
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const auto& dev = p.devices[d];
    const std::string what = "device " + std::to_string(d) + ": ";
    check_node(dev.board, n, what + "board.");
    if (dev.edge < -1 || dev.edge >= static_cast<int>(p.edges.size()))
      throw core::error("split problem: " + what + "edge " + std::to_string(dev.edge) + " out of range (" +
                        std::to_string(p.edges.size()) + " edges)");
    check_link(dev.link, what + "link");
  }
}

std::vector<core::tier> path_of(const split_problem& p, int device) {
  check_device_index(p, device);
  const bool edge = dev_of(p, device).edge >= 0;
  if (p.u_shape)
    return edge ? std::vector{core::tier::device, core::tier::edge, core::tier::server, core::tier::edge,
                              core::tier::device}
                : std::vector{core::tier::device, core::tier::server, core::tier::device};
  return edge ? std::vector{core::tier::device, core::tier::edge, core::tier::server}
              : std::vector{core::tier::device, core::tier::server};
}

route_cost evaluate_route(const split_problem& p, int device, const route& r) {
  validate(p);
  check_route(p, device, r);
  return evaluate_checked(p, device, r);
}

plan_cost evaluate_plan(const split_problem& p, const std::vector<route>& routes) {
  validate(p);
  if (routes.size() != p.devices.size())
    throw core::error("plan has " + std::to_string(routes.size()) + " routes for " + std::to_string(p.devices.size()) +
                      " devices");
  for (std::size_t d = 0; d < routes.size(); ++d) check_route(p, static_cast<int>(d), routes[d]);
  return assemble(p, routes);
}

split_plan plan_exhaustive(const split_problem& p) {
  validate(p);
  split_plan out;
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const int di = static_cast<int>(d);
    route r{path_of(p, di), {}, p.n_blocks};
    std::optional<route> best;
    double best_seconds = unlimited;
    std::vector<int> cuts;
    each_cuts(p.n_blocks, p.u_shape, r.path.size() - 1, cuts, [&](const std::vector<int>& c) {
      r.cuts = c;
      const auto cost = evaluate_checked(p, di, r);
      if (cost.feasible && (!best || cost.seconds < best_seconds)) best = r, best_seconds = cost.seconds;
    });
    if (!best) throw_infeasible(p, di);
    out.routes.push_back(*best);
  }
  out.cost = assemble(p, out.routes);
  return out;
}

double migration_seconds(const split_problem& p, int device, const route& from, const route& to) {
  validate(p);
  check_route(p, device, from);
  check_route(p, device, to);
  return migration_checked(p, device, from, to);
}

resplit_decision decide_resplit(const split_problem& p, const std::vector<route>& current, const split_plan& proposed,
                                const resplit_policy& policy) {
  const plan_cost now = evaluate_plan(p, current);
  if (proposed.routes.size() != p.devices.size())
    throw core::error("proposed plan has " + std::to_string(proposed.routes.size()) + " routes for " +
                      std::to_string(p.devices.size()) + " devices");
  resplit_decision out;
  out.current_seconds = now.step_seconds;
  out.proposed_seconds = proposed.cost.step_seconds;
  for (std::size_t d = 0; d < current.size(); ++d) {
    check_route(p, static_cast<int>(d), proposed.routes[d]);
    out.migration_seconds += migration_checked(p, static_cast<int>(d), current[d], proposed.routes[d]);
  }
  const double cur = out.current_seconds, next = out.proposed_seconds, gain = cur - next;
  std::string line = "predicted step " + ms_str(cur) + " -> " + ms_str(next);
  if (cur > 0) line += fmt::format(" ({:+.0f}%)", -gain / cur * 100.0);
  line += ", migration " + ms_str(out.migration_seconds);
  if (!proposed.cost.feasible) {
    out.reason = line + ": the proposed plan does not fit in memory: keep";
  } else if (!now.feasible) {
    out.change = true;
    out.reason = line + ": the current plan does not fit in memory: re-split";
  } else if (gain < policy.min_gain * cur) {
    out.reason = line + fmt::format(": gain {:.0f}% below {:.0f}%: keep", cur > 0 ? gain / cur * 100.0 : 0.0,
                                    policy.min_gain * 100.0);
  } else if (!(gain * static_cast<double>(policy.steps_per_round) * policy.repay_rounds > out.migration_seconds)) {
    out.reason = line + fmt::format(": {} saved over {} rounds of {} steps does not repay it: keep",
                                    ms_str(gain * static_cast<double>(policy.steps_per_round) * policy.repay_rounds),
                                    policy.repay_rounds, policy.steps_per_round);
  } else {
    out.change = true;
    out.reason = line + ": re-split";
  }
  return out;
}

}  // namespace cleave::split
