// Re-planning a training federation, a device's round under several plans, its starting route,
// and the routes in force as checkpoint fields.
#include "cleave/split/replan.h"

#include <algorithm>
#include <charconv>
#include <chrono>

#include "cleave/core/error.h"

namespace cleave::split {

namespace {

// A whole field as a count; throws naming it.
std::uint64_t count_of(const std::string& text, const std::string& key) {
  std::uint64_t v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc{} || r.ptr != text.data() + text.size() || text.empty())
    throw core::error(key + ": '" + text + "' is not a count");
  return v;
}

// Blocks some but fewer than min_holders of `routes` keep on the device.
int thin_blocks(const std::vector<route>& routes, int min_holders) {
  int n = 0;
  for (const auto& [f, e] : device_blocks(routes)) n += e - f;
  for (const auto& [f, e] : device_blocks(routes, min_holders)) n -= e - f;
  return n;
}

}  // namespace

bool takes_off_device(const route& from, const route& to) {
  return device_blocks({from, to}, 2) != device_blocks({from});
}

std::vector<core::hop_codecs> exact_output(const route& r, std::vector<core::hop_codecs> hops) {
  for (std::size_t k = 0; k < hops.size(); ++k)
    if (r.end(static_cast<int>(k)) == r.n_blocks) hops[k] = {};
  return hops;
}

replan_outcome replan(const split_problem& p, const std::vector<running_device>& devs, const resplit_policy& policy,
                      int min_holders) {
  replan_outcome out;
  std::vector<route> current;
  std::vector<route_choice> running;
  for (const auto& d : devs) {
    current.push_back(d.current);
    running.push_back(d.running);
  }
  split_plan best;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    best = plan_best(p);
    out.planner_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (std::size_t i = 0; i < devs.size(); ++i)
      if (devs[i].held) {
        best.routes[i] = current[i];
        best.choices[i] = running[i];
      }
    best.cost = evaluate_plan(p, best.routes, best.choices);
  } catch (const core::error& e) {
    out.no_fit = e.what();
    return out;
  }
  out.decision = decide_resplit(p, current, running, best, policy);
  if (!out.decision.change) return out;
  for (std::size_t i = 0; i < devs.size(); ++i) {
    if (devs[i].held) continue;
    // Compared as the nodes run them (the output's hop is always f32).
    if (best.routes[i] == current[i] && exact_output(best.routes[i], best.choices[i].hops) == running[i].hops) continue;
    const auto now = evaluate_route(p, static_cast<int>(i), current[i], running[i]);
    const double next = best.cost.devices[i].seconds;
    if (now.feasible && now.seconds - next < policy.min_gain * now.seconds) continue;
    out.moves.push_back({i, best.routes[i], best.choices[i].hops, now.seconds, next});
  }
  if (min_holders <= 1) return out;
  auto all = current;  // the moves together (devices moving alike keep their blocks shared)
  for (const auto& m : out.moves) all[m.device] = m.to;
  if (thin_blocks(all, min_holders) <= thin_blocks(current, min_holders)) return out;
  std::sort(out.moves.begin(), out.moves.end(), [](const resplit_move& a, const resplit_move& b) {
    return a.now_seconds - a.next_seconds > b.now_seconds - b.next_seconds;
  });
  std::vector<resplit_move> kept;
  for (auto& m : out.moves) {
    auto after = current;
    after[m.device] = m.to;
    if (thin_blocks(after, min_holders) > thin_blocks(current, min_holders)) continue;
    current = std::move(after);
    kept.push_back(std::move(m));
  }
  out.moves = std::move(kept);
  return out;
}

std::vector<priced_leg> price_legs(const split_problem& p, int device, const std::vector<plan_leg>& legs,
                                   const route& current, double now_seconds, std::uint64_t steps) {
  std::vector<priced_leg> out;
  std::uint64_t from = 0;
  for (std::size_t l = 0; l < legs.size(); ++l) {
    const route& next = l + 1 < legs.size() ? legs[l + 1].r : current;
    out.push_back({legs[l].r, legs[l].until - from, evaluate_route(p, device, legs[l].r, legs[l].choice).seconds,
                   migration_seconds(p, device, legs[l].r, next)});
    from = legs[l].until;
  }
  out.push_back({current, steps - from, now_seconds, 0.0});
  return out;
}

double mean_step_seconds(const std::vector<priced_leg>& legs, std::uint64_t steps) {
  double seconds = 0;
  for (const auto& l : legs) seconds += static_cast<double>(l.steps) * l.step_seconds + l.migration_seconds;
  return seconds / static_cast<double>(steps);
}

int trained_bottom(const core::model_spec& m) {
  for (int b = 0; b < m.n_blocks(); ++b)
    if (m.blocks[static_cast<std::size_t>(b)].n_params > 0) return b + 1;
  return 0;
}

route starting_route(const core::model_spec& m, bool u_shape, bool behind_edge, const std::vector<int>& cuts,
                     int min_device_blocks, const std::string& option) {
  const std::string what = option + " '" + cuts_text(cuts) + "'";
  route r;
  try {
    r = configured_route(m, u_shape, behind_edge, cuts);
  } catch (const core::error& e) {
    throw core::error(what + " for model '" + m.name + "': " + e.what());
  }
  if (r.end(0) >= min_device_blocks) return r;
  if (!cuts.empty())
    throw core::error(what + " keep " + std::to_string(r.end(0)) +
                      " blocks on the device, fewer than --min-device-blocks " + std::to_string(min_device_blocks));
  for (auto& c : r.cuts) c = std::max(c, min_device_blocks);  // the default cuts, deepened
  return make_route(u_shape, behind_edge, r.cuts, m.n_blocks());
}

void write_routes(std::map<std::string, std::string>& meta, const std::map<std::uint32_t, epoch_route>& routes) {
  for (const auto& [id, r] : routes) {
    const std::string key = "route:" + std::to_string(id);
    meta[key] = r.r.str();
    meta[key + ":epoch"] = std::to_string(r.epoch);
  }
}

std::map<std::uint32_t, epoch_route> read_routes(const std::map<std::string, std::string>& meta, int n_blocks,
                                                 bool u_shape, std::uint32_t last_epoch) {
  std::map<std::uint32_t, epoch_route> out;
  for (const auto& [key, text] : meta) {
    if (!key.starts_with("route:") || key.ends_with(":epoch")) continue;
    const std::uint64_t dev = count_of(key.substr(6), key);
    if (dev == 0 || dev >= 1000000) throw core::error(key + ": device id " + std::to_string(dev) + " out of range");
    epoch_route er;
    try {
      er.r = parse_route(text, n_blocks);
    } catch (const core::error& e) {
      throw core::error(key + ": " + e.what());
    }
    if (er.r.u_shape() != u_shape)
      throw core::error(key + ": " + er.r.str() + " is " + (u_shape ? "not " : "") + "U-shaped, this run " +
                        (u_shape ? "is" : "is not"));
    const std::string ek = key + ":epoch";
    const auto e = meta.find(ek);
    if (e == meta.end()) throw core::error(ek + " is missing");
    const std::uint64_t plan = count_of(e->second, ek);
    if (plan < 1 || plan > last_epoch)
      throw core::error(ek + ": plan " + std::to_string(plan) + " is not between 1 and the checkpoint's plan " +
                        std::to_string(last_epoch));
    er.epoch = static_cast<std::uint32_t>(plan);
    out[static_cast<std::uint32_t>(dev)] = std::move(er);
  }
  return out;
}

}  // namespace cleave::split
