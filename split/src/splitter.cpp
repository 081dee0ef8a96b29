// The adaptive splitter's cost model (evaluate_route, the oracle), route memory, and the
// re-split policy.
#include "cleave/split/splitter.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "cleave/core/error.h"
#include "cost_terms.h"

namespace cleave::split {

using namespace detail;

// Floating-point discipline. plan_best and evaluate_route must give bit-identical costs, or a tie
// (zero-cost blocks, integer-valued profiles) could be broken differently by the planner and by the
// exhaustive search. So all of them:
//   - sum a segment's blocks (their whole time, forward_of or backward_of) from its first block
//     upward, starting at 0, then multiply by the share, then divide by M (segment_stage);
//   - price a hop's directions with direction_seconds();
//   - put these terms in a route_terms and take T from time_of() (cost_terms.h), which adds the
//     stages from the top of the path down:
//       sum = s_0 + (hop_0 + (s_1 + (hop_1 + ... + s_last)))
//     (the order a dynamic programme over suffixes accumulates in), then (M - 1) * the longest
//     stage (pipeline_seconds), then the round trips, and takes the max with the busy bounds;
//     searches compare whole T (the busy bounds hold other parts of the latency than P does);
//   - sum a node's memory per segment the same way, then the segments in path order.
// IEEE addition, multiplication by a number >= 0 and max are monotone (a <= b implies
// fl(a + x) <= fl(b + x)), so T never decreases when one term grows: the least T over the codecs
// of a hop is reached by the fastest codec of each direction, and a bound computed from lower
// bounds of the terms (or from some of P's terms alone: T >= P) is a lower bound of T, also in
// floating point. These files are compiled with -ffp-contract=off so that no multiply-add is
// fused in one place only.

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

// Route r's terms under choice c, and the busy times over the whole step. p, r and c are checked.
struct route_parts {
  route_terms t;
  double compute = 0, transfer = 0;
};

route_parts parts_of(const split_problem& p, int d, const route& r, const route_choice& c) {
  route_parts out;
  // A route holding every block on the device is its first segment alone (see splitter.h).
  const int m = c.n_micro_batches, n_segments = r.device_only() ? 1 : r.n_segments();
  out.t.n_segments = n_segments;
  out.t.m = m;
  out.t.u_shape = r.u_shape();
  for (int k = 0; k < n_segments; ++k) {
    const auto i = static_cast<std::size_t>(k);
    const core::tier t = r.path[i];
    const node_costs& node = node_of(p, d, t);
    const double share = share_of(p, d, t);
    double sum = 0, fwd = 0, bwd = 0;
    for (int b = r.begin(k); b < r.end(k); ++b) {
      const auto j = static_cast<std::size_t>(b);
      sum += node.block_seconds[j];
      fwd += forward_of(node, j);
      bwd += backward_of(node, j);
    }
    const double seg = sum * share;
    out.t.seg[i] = segment_stage(seg, m);
    out.compute += seg;
    if (k + 1 == n_segments) break;  // the last segment runs both passes in one go
    out.t.fwd[i] = segment_stage(fwd * share, m);
    out.t.bwd[i] = segment_stage(bwd * share, m);
    const auto& link = link_between(p, d, t, r.path[i + 1]);
    const int cut = r.end(k);
    out.t.up[i] = direction_seconds(p, link, *find_codec(p, c.hops[i].up), cut, m);
    out.t.down[i] = direction_seconds(p, link, *find_codec(p, c.hops[i].down), cut, m);
    out.t.rtt[i] = link.rtt_seconds;
    out.transfer += hop_stage(out.t.up[i], out.t.down[i]) * static_cast<double>(m);
  }
  return out;
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

// The oracle: T_d straight from the definition (see splitter.h).
route_cost evaluate_checked(const split_problem& p, int d, const route& r, const route_choice& c) {
  const route_parts parts = parts_of(p, d, r, c);
  const route_time t = time_of(parts.t);
  route_cost out;
  out.seconds = t.seconds;
  out.compute_seconds = parts.compute;
  out.transfer_seconds = parts.transfer;
  out.fill_seconds = t.sum + t.latency;
  out.bottleneck_seconds = t.top;
  out.busy_seconds = t.busy;
  out.feasible = fits_memory(p, d, r, &out.why);
  return out;
}

bool fits_memory(const split_problem& p, int d, const route& r, std::string* why) {
  bool fits = true;
  if (const int depth = r.end(0); depth < p.min_device_blocks) {
    fits = false;
    if (!why) return false;
    *why += "the device keeps " + std::to_string(depth) + " block" + (depth == 1 ? "" : "s") + ", fewer than the " +
            std::to_string(p.min_device_blocks) + " it must";
  }
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
    if (bytes <= cap) continue;
    fits = false;
    if (!why) return false;
    std::string node = t == core::tier::device ? "device board"
                       : t == core::tier::edge ? "edge " + std::to_string(dev_of(p, d).edge) + " share"
                                               : "server share";
    *why += (why->empty() ? "" : "; ") + node + " needs " + bytes_str(bytes) + " of " + bytes_str(cap);
  }
  return fits;
}

void each_cuts(int n, bool u_shape, std::size_t n_cuts, std::vector<int>& cuts,
               const std::function<void(const std::vector<int>&)>& f) {
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
  std::string what =
      "split problem: device " + std::to_string(d) + ": no route fits its memory (" + shares + ")" +
      (p.min_device_blocks > 1 ? " keeping at least " + std::to_string(p.min_device_blocks) + " blocks on the device"
                               : std::string()) +
      ": ";
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

plan_cost assemble(const split_problem& p, const std::vector<route>& routes, const std::vector<route_choice>& choices) {
  plan_cost out;
  for (std::size_t d = 0; d < routes.size(); ++d) {
    out.devices.push_back(evaluate_checked(p, static_cast<int>(d), routes[d], choices[d]));
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

route_cost evaluate_route(const split_problem& p, int device, const route& r, const route_choice& choice) {
  validate(p);
  check_route(p, device, r);
  check_choice(p, device, r, choice);
  return evaluate_checked(p, device, r, choice);
}

route_cost evaluate_route(const split_problem& p, int device, const route& r) {
  return evaluate_route(p, device, r, default_choice(p, r.path.empty() ? 0 : r.path.size() - 1));
}

plan_cost evaluate_plan(const split_problem& p, const std::vector<route>& routes,
                        const std::vector<route_choice>& choices) {
  validate(p);
  if (routes.size() != p.devices.size())
    throw core::error("plan has " + std::to_string(routes.size()) + " routes for " + std::to_string(p.devices.size()) +
                      " devices");
  if (choices.size() != routes.size())
    throw core::error("plan has " + std::to_string(choices.size()) + " route choices for " +
                      std::to_string(routes.size()) + " routes");
  for (std::size_t d = 0; d < routes.size(); ++d) {
    check_route(p, static_cast<int>(d), routes[d]);
    check_choice(p, static_cast<int>(d), routes[d], choices[d]);
  }
  return assemble(p, routes, choices);
}

plan_cost evaluate_plan(const split_problem& p, const std::vector<route>& routes) {
  std::vector<route_choice> choices;
  for (const auto& r : routes) choices.push_back(default_choice(p, r.path.empty() ? 0 : r.path.size() - 1));
  return evaluate_plan(p, routes, choices);
}

double migration_seconds(const split_problem& p, int device, const route& from, const route& to) {
  validate(p);
  check_route(p, device, from);
  check_route(p, device, to);
  return migration_checked(p, device, from, to);
}

resplit_decision decide_resplit(const split_problem& p, const std::vector<route>& current,
                                const std::vector<route_choice>& current_choices, const split_plan& proposed,
                                const resplit_policy& policy) {
  const plan_cost now = evaluate_plan(p, current, current_choices);
  if (proposed.routes.size() != p.devices.size())
    throw core::error("proposed plan has " + std::to_string(proposed.routes.size()) + " routes for " +
                      std::to_string(p.devices.size()) + " devices");
  // The proposal priced under its own choices (default ones when it has none).
  const plan_cost next_cost = proposed.choices.empty() ? evaluate_plan(p, proposed.routes)
                                                       : evaluate_plan(p, proposed.routes, proposed.choices);
  resplit_decision out;
  out.current_seconds = now.step_seconds;
  out.proposed_seconds = next_cost.step_seconds;
  for (std::size_t d = 0; d < current.size(); ++d)
    out.migration_seconds += migration_checked(p, static_cast<int>(d), current[d], proposed.routes[d]);
  const double cur = out.current_seconds, next = out.proposed_seconds, gain = cur - next;
  std::string line = "predicted step " + ms_str(cur) + " -> " + ms_str(next);
  if (cur > 0) line += fmt::format(" ({:+.0f}%)", -gain / cur * 100.0);
  line += ", migration " + ms_str(out.migration_seconds);
  if (!next_cost.feasible) {
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

resplit_decision decide_resplit(const split_problem& p, const std::vector<route>& current, const split_plan& proposed,
                                const resplit_policy& policy) {
  std::vector<route_choice> choices;
  for (const auto& r : current) choices.push_back(default_choice(p, r.path.empty() ? 0 : r.path.size() - 1));
  return decide_resplit(p, current, choices, proposed, policy);
}

namespace {

// Seconds per value to encode and decode c on this host (the fastest of three runs over 256 Ki
// values): what a hop's codec costs besides its bytes.
double codec_seconds_per_value(const core::codec_set& set, core::codec c) {
  constexpr std::int64_t n = 1 << 18;
  std::vector<float> x(static_cast<std::size_t>(n)), y(x.size()), residual(x.size(), 0.0f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 1021) - 510) * 0.01f;
  const core::channel_layout l{64, 64, n / 4096};
  std::vector<std::uint16_t> h(x.size());
  std::vector<std::int8_t> q(x.size());
  std::vector<float> scales(64);
  const std::int64_t k = core::topk_count(n, set.topk_fraction);
  std::vector<float> values(static_cast<std::size_t>(k));
  std::vector<std::uint32_t> pos(static_cast<std::size_t>(k));
  double best = 1e30;
  for (int run = 0; run < 3; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    switch (c) {
      case core::codec::f32:
        return 0;
      case core::codec::f16:
        core::encode_f16(x.data(), h.data(), n);
        core::decode_f16(h.data(), y.data(), n);
        break;
      case core::codec::bf16:
        core::encode_bf16(x.data(), h.data(), n);
        core::decode_bf16(h.data(), y.data(), n);
        break;
      case core::codec::int8:
        core::encode_int8(x.data(), l, q.data(), scales.data(), set.stochastic, 1);
        core::decode_int8(q.data(), scales.data(), l, y.data());
        break;
      case core::codec::topk:
        core::encode_topk(x.data(), n, k, residual.data(), values.data(), pos.data());
        core::decode_topk(values.data(), pos.data(), k, y.data(), n);
        break;
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best / static_cast<double>(n);
}

}  // namespace

std::vector<codec_option> measure_codecs(const core::codec_set& set) {
  std::vector<codec_option> out;
  for (core::codec c : set.allowed) out.push_back({c, codec_seconds_per_value(set, c)});
  return out;
}

}  // namespace cleave::split
