// The server's plans and its adaptive splitter: routes and cut settings, profiles in, plans out,
// re-splits announced and cut over, the splitter's part of a checkpoint.
#include "splitter.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>

namespace cleave::server {

namespace {

constexpr std::string_view book_prefix = "book:";

// A whole field as a count; throws naming it.
std::uint64_t count_of(const std::string& text, const std::string& key) {
  std::uint64_t v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc{} || r.ptr != text.data() + text.size() || text.empty())
    throw core::error(key + ": '" + text + "' is not a count");
  return v;
}

// "int8/topk" per hop, hops joined by ','.
std::string codecs_text(const std::vector<core::hop_codecs>& hops) {
  std::string out;
  for (const auto& h : hops) {
    if (!out.empty()) out += ',';
    out += std::string(core::codec_name(h.up)) + "/" + std::string(core::codec_name(h.down));
  }
  return out;
}

}  // namespace

void splitter::measure_codecs() {
  codec_options_ = split::measure_codecs(c_.codecs);
  std::string text;
  for (const auto& o : codec_options_)
    text += fmt::format("{}{} {:.2f} ns", text.empty() ? "" : ", ", core::codec_name(o.id), o.seconds_per_value * 1e9);
  if (codec_options_.size() > 1)
    spdlog::info("server: cut codecs the planner may choose, per value encoded and decoded: {}", text);
}

void splitter::add_choices(split::split_problem& p) const {
  p.codecs = codec_options_;
  p.topk_fraction = c_.codecs.topk_fraction;
  p.batch = c_.batch;
  p.micro_batch_options = {c_.micro_batches};  // micro-batches change batch-norm statistics: fixed
  p.min_device_blocks = c_.min_device_blocks;
  p.cut_channels.assign(static_cast<std::size_t>(model_.n_blocks() + 1), 1.0);
  for (int c = 0; c <= model_.n_blocks(); ++c) {
    const auto& s = c < model_.n_blocks() ? model_.blocks[static_cast<std::size_t>(c)].in : model_.blocks.back().out;
    if (s.rank() >= 1) p.cut_channels[static_cast<std::size_t>(c)] = static_cast<double>(s[0]);
  }
}

std::vector<split::route_choice> splitter::running_choices(
    const std::vector<split::profile_book::device_entry>& devs) const {
  std::vector<split::route_choice> out;
  for (const auto& e : devs) {
    const auto& d = *members_.find(e.id);
    out.push_back({c_.micro_batches, cut_of(d.rs.route, &d.hops).hops});
  }
  return out;
}

void splitter::propose(std::uint32_t device, const split::route& r, const std::vector<core::hop_codecs>& hops,
                       const std::string& why) {
  auto& d = *members_.find(device);
  if (d.rs.next || !d.connected) return;
  const std::string codecs_before = codecs_text(cut_of(d.rs.route, &d.hops).hops);
  d.rs.announce(r, ++epoch_);
  d.next_hops = hops;
  const std::string codecs_after = codecs_text(cut_of(r, &d.next_hops).hops);
  spdlog::info("server: re-split device {} ({}): {} -> {}{} (plan {})", device, why, d.rs.route.str(), r.str(),
               codecs_before == codecs_after ? std::string() : ", codecs " + codecs_before + " -> " + codecs_after,
               d.rs.next_epoch);
  d.via->post(plan_message(device, true));
}

split::route splitter::cut_over(device_state& d, std::uint32_t epoch, std::uint64_t step, std::uint64_t round,
                                bool leg) {
  const split::route from = d.rs.cut_over(epoch);
  if (leg) d.legs.push_back({from, d.hops, step % static_cast<std::uint64_t>(c_.local_steps)});
  d.hops = std::move(d.next_hops);
  d.next_hops.clear();
  d.measured = false;
  d.moved_round = round;
  return from;
}

double splitter::on_profile(const runtime::session_ptr& s, const wire::Profile& m,
                            const std::list<runtime::session_ptr>& sessions) {
  auto prof = protocol::profile_of(m, model_.n_blocks());
  if (!book_) return 0;  // not splitting adaptively
  const std::uint32_t node = m.node_id();
  const split::node_key server{core::tier::server, 0};
  std::string about;
  if (s->role == core::tier::device || node != s->id) {
    // A device's own profile, directly or relayed by its edge.
    auto* at = members_.attached(node, s, "profile");
    if (!at) return 0;
    auto& d = *at;
    const split::node_key dk{core::tier::device, node};
    const split::node_key up = d.behind_edge ? split::node_key{core::tier::edge, s->id} : server;
    for (const auto& l : prof.links) book_->report_link(dk, up, l.rtt_us * 1e-6, l.bandwidth_bytes_per_s);
    about = "device " + std::to_string(node);
    book_->set_profile(dk, std::move(prof));
    d.measured = true;
  } else {
    const split::node_key ek{core::tier::edge, node};
    for (const auto& l : prof.links) {
      const split::node_key peer_key = l.peer_id == 0 ? server : split::node_key{core::tier::device, l.peer_id};
      book_->report_link(ek, peer_key, l.rtt_us * 1e-6, l.bandwidth_bytes_per_s);
    }
    about = "edge " + std::to_string(node);
    book_->set_profile(ek, std::move(prof));
  }
  return maybe_replan("profile of " + about, sessions);
}

void splitter::set_server_profile(split::node_profile p) {
  if (book_) book_->set_profile({core::tier::server, 0}, std::move(p));
}

std::vector<split::profile_book::device_entry> splitter::planned_devices() const {
  std::vector<split::profile_book::device_entry> out;
  for (const auto& [id, d] : members_.all())
    if (d.connected) out.push_back({id, d.behind_edge ? d.via->id : 0, d.behind_edge});
  return out;
}

std::map<std::uint32_t, double> splitter::predicted_steps(const std::set<std::uint32_t>& ids) {
  std::map<std::uint32_t, double> out;
  if (!book_) return out;
  std::vector<split::profile_book::device_entry> devs;
  for (const auto& e : planned_devices())
    if (ids.count(e.id)) devs.push_back(e);
  std::string missing;
  auto prob = book_->problem(devs, missing);
  if (!prob || devs.empty()) return out;
  add_choices(*prob);
  std::vector<split::route> routes;
  for (const auto& e : devs) routes.push_back(members_.find(e.id)->rs.route);
  try {
    // All of them at once: each shares the server and its edge with the others, as in a round.
    const auto cost = split::evaluate_plan(*prob, routes, running_choices(devs));
    const double steps = static_cast<double>(c_.local_steps);
    for (std::size_t i = 0; i < devs.size(); ++i) {
      const auto& d = *members_.find(devs[i].id);
      const int di = static_cast<int>(i);
      // The steps it ran under earlier plans this round (a device's cost does not depend on the
      // others' routes), and the moves between them.
      double seconds = 0;
      std::uint64_t from = 0;
      for (std::size_t l = 0; l < d.legs.size(); ++l) {
        const auto& leg = d.legs[l];
        const split::route_choice ch{c_.micro_batches, cut_of(leg.route, &leg.hops).hops};
        seconds += static_cast<double>(leg.until - from) * split::evaluate_route(*prob, di, leg.route, ch).seconds;
        from = leg.until;
        const auto& next = l + 1 < d.legs.size() ? d.legs[l + 1].route : routes[i];
        seconds += split::migration_seconds(*prob, di, leg.route, next);
      }
      out[devs[i].id] = (seconds + (steps - static_cast<double>(from)) * cost.devices[i].seconds) / steps;
    }
  } catch (const core::error&) {
    out.clear();
  }
  return out;
}

double splitter::predicted_step(const std::set<std::uint32_t>& ids) {
  double most = 0;
  for (const auto& [id, s] : predicted_steps(ids)) most = std::max(most, s);
  return most;
}

double splitter::maybe_replan(const std::string& why, const std::list<runtime::session_ptr>& sessions) {
  if (!c_.adaptive || c_.mode != training_mode::splitfed || ex_.stopping() || !book_) return 0;
  const auto devs = planned_devices();
  if (devs.empty()) return 0;
  // One re-split at a time per device, and its next only once it has been measured under it.
  // The others may move meanwhile: a device's cost depends on the others only through how many
  // share a node, not on their routes (see splitter.h), so its best route is its own.
  std::vector<bool> held(devs.size());
  for (std::size_t i = 0; i < devs.size(); ++i)
    held[i] = members_.find(devs[i].id)->rs.next || !members_.find(devs[i].id)->measured;
  if (std::all_of(held.begin(), held.end(), [](bool h) { return h; })) return 0;
  // This side's view of its links.
  for (const auto& s : sessions) {
    const auto l = s->measured_link(s->id);
    book_->report_link({core::tier::server, 0}, {s->role, s->id}, l.rtt_us * 1e-6, l.bandwidth_bytes_per_s);
  }
  std::string missing;
  auto prob = book_->problem(devs, missing);
  if (!prob) {
    spdlog::debug("server: no plan yet ({}): waiting for {}", why, missing);
    return 0;
  }
  add_choices(*prob);
  std::vector<split::route> current;
  for (const auto& e : devs) current.push_back(members_.find(e.id)->rs.route);
  // How devices run now (the configured micro-batches, their hops' codecs); the plan says how
  // each could run.
  const auto running = running_choices(devs);
  split::split_plan best;
  double planner_s = 0;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    best = split::plan_best(*prob);
    planner_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The held devices stay as they run.
    for (std::size_t i = 0; i < devs.size(); ++i)
      if (held[i]) {
        best.routes[i] = current[i];
        best.choices[i] = running[i];
      }
    best.cost = split::evaluate_plan(*prob, best.routes, best.choices);
  } catch (const core::error& e) {
    spdlog::warn("server: no plan fits ({}): {}", why, e.what());
    return planner_s;
  }
  split::resplit_policy policy;
  policy.min_gain = c_.min_gain;
  policy.repay_rounds = c_.repay_rounds;
  policy.steps_per_round = c_.local_steps;
  const auto d = split::decide_resplit(*prob, current, running, best, policy);
  if (!d.change) {
    spdlog::debug("server: plan kept ({}): {}", why, d.reason);
    return planner_s;
  }
  spdlog::info("server: re-plan ({}): {}", why, d.reason);
  // Only the devices whose own step gains enough move (or whose route no longer fits): the
  // others would pay a migration for nothing the federation's step time sees.
  for (std::size_t i = 0; i < devs.size(); ++i) {
    if (held[i]) continue;
    // (Compared as the nodes run them: the output's hop is always f32.)
    if (best.routes[i] == current[i] && cut_of(best.routes[i], &best.choices[i].hops).hops == running[i].hops) continue;
    const auto now = split::evaluate_route(*prob, static_cast<int>(i), current[i], running[i]);
    const double next = best.cost.devices[i].seconds;
    if (now.feasible && now.seconds - next < c_.min_gain * now.seconds) continue;
    propose(devs[i].id, best.routes[i], best.choices[i].hops,
            fmt::format("its step {:.1f} -> {:.1f} ms", now.seconds * 1e3, next * 1e3));
  }
  return planner_s;
}

void splitter::start(split::node_profile server) {
  book_ = std::make_unique<split::profile_book>(model_, std::max(1, c_.batch / c_.micro_batches), c_.micro_batches,
                                                c_.u_shape);
  book_->set_profile({core::tier::server, 0}, std::move(server));
  measure_codecs();
}

split::route splitter::route_for_device(bool behind_edge) const {
  const std::vector<int>& cuts = behind_edge ? c_.edge_cuts : c_.cuts;
  const std::string what = std::string(behind_edge ? "--edge-cuts" : "--cuts") + " '" + split::cuts_text(cuts) + "'";
  split::route r;
  try {
    r = split::configured_route(model_, c_.u_shape, behind_edge, cuts);
  } catch (const core::error& e) {
    throw core::error(what + " for model '" + model_.name + "': " + e.what());
  }
  if (r.end(0) >= c_.min_device_blocks) return r;
  if (!cuts.empty())
    throw core::error(what + " keep " + std::to_string(r.end(0)) +
                      " blocks on the device, fewer than --min-device-blocks " + std::to_string(c_.min_device_blocks));
  for (auto& c : r.cuts) c = std::max(c, c_.min_device_blocks);  // the default cuts, deepened
  return split::make_route(c_.u_shape, behind_edge, r.cuts, model_.n_blocks());
}

std::string splitter::place(std::uint32_t id, device_state& d) {
  d.rs.reset(route_for_device(d.behind_edge), epoch_);
  const auto it = resumed_routes_.find(id);
  if (it == resumed_routes_.end()) return {};
  if (it->second.route.has_edge() == d.behind_edge) {
    // Its route before the restart, under the same plan epoch and run: its segments and theirs
    // on the way keep their state.
    d.rs.reset(it->second.route, it->second.epoch);
    return fmt::format(", its route at the checkpoint (plan {})", it->second.epoch);
  }
  spdlog::warn(
      "server: device {} rejoined {}; its route at the checkpoint ({}) is not for that, the configured cuts apply", id,
      d.behind_edge ? "behind an edge" : "directly", it->second.route.str());
  resumed_routes_.erase(it);
  return {};
}

transport::message_builder splitter::plan_message(std::uint32_t device, bool resplit) const {
  const auto& d = *members_.find(device);
  protocol::plan_desc p;
  p.epoch = resplit ? d.rs.next_epoch : d.rs.epoch;
  p.resplit = resplit;
  p.model_json = model_.json;
  p.training = {c_.opt, c_.seed};
  p.micro_batch_size = static_cast<std::uint32_t>(c_.batch / c_.micro_batches);
  p.n_micro_batches = static_cast<std::uint32_t>(c_.micro_batches);
  p.device_id = device;
  p.edge_id = d.behind_edge ? d.via->id : 0;
  p.route = resplit ? *d.rs.next : d.rs.route;
  p.run_id = run_id_;
  const auto cut = cut_of(p.route, resplit ? &d.next_hops : &d.hops);
  if (std::any_of(cut.hops.begin(), cut.hops.end(), [](const auto& h) { return !(h == core::hop_codecs{}); }))
    p.hops = cut.hops;  // f32 everywhere: nothing to say (plans as before)
  p.topk_fraction = cut.topk_fraction;
  p.stochastic_rounding = cut.stochastic_rounding;
  p.topk_feedback = cut.topk_feedback;
  p.secure_aggregation = c_.secure_aggregation;
  p.resume = d.resumes;
  return protocol::make_plan(p);
}

protocol::cut_settings splitter::cut_of(const split::route& r, const std::vector<core::hop_codecs>* hops) const {
  protocol::cut_settings c;
  c.n_micro_batches = static_cast<std::uint32_t>(c_.micro_batches);
  if (hops && hops->size() + 1 == r.path.size())
    c.hops = *hops;
  else
    c.hops.assign(r.path.size() - 1, core::compact_codecs(c_.codecs));
  c.keep_output_exact(r);
  c.topk_fraction = c_.codecs.topk_fraction;
  c.stochastic_rounding = c_.codecs.stochastic;
  c.topk_feedback = c_.codecs.topk_feedback;
  return c;
}

std::map<std::string, std::string> splitter::state(
    const std::vector<std::pair<std::uint32_t, split::route>>& routes) const {
  std::map<std::string, std::string> m;
  m["plan_epoch"] = std::to_string(epoch_);
  for (const auto& [id, d] : members_.all()) {
    const bool in_round = std::any_of(routes.begin(), routes.end(), [id = id](const auto& r) { return r.first == id; });
    if (!d.connected && !in_round) continue;
    const std::string key = "route:" + std::to_string(id);
    m[key] = d.rs.route.str();
    m[key + ":epoch"] = std::to_string(d.rs.epoch);
  }
  if (book_) book_->write(m, book_prefix);
  return m;
}

std::string splitter::resumed_text() const {
  if (!book_) return {};
  std::string routes;
  for (const auto& [id, r] : resumed_routes_)
    routes += fmt::format("{}device {} {} (plan {})", routes.empty() ? "" : ", ", id, r.route.str(), r.epoch);
  return fmt::format("; the splitter's book of {} node{} and {} link{}, routes: {}", book_->profiles().size(),
                     book_->profiles().size() == 1 ? "" : "s", book_->links().size(),
                     book_->links().size() == 1 ? "" : "s", routes.empty() ? "none" : routes);
}

void splitter::resume(const core::checkpoint& ck, std::uint32_t epoch) {
  epoch_ = epoch;
  // A checkpoint of a fixed plan, or of a server that did not split adaptively, stores neither
  // routes worth restoring nor a book: the configured cuts and fresh profiles then.
  if (!book_) return;
  for (const auto& [key, text] : ck.meta) {
    if (!key.starts_with("route:") || key.ends_with(":epoch")) continue;
    const std::uint64_t dev = count_of(key.substr(6), key);
    if (dev == 0 || dev >= 1000000) throw core::error(key + ": device id " + std::to_string(dev) + " out of range");
    resumed_route rr;
    try {
      rr.route = split::parse_route(text, model_.n_blocks());
    } catch (const core::error& e) {
      throw core::error(key + ": " + e.what());
    }
    if (rr.route.u_shape() != c_.u_shape)
      throw core::error(key + ": " + rr.route.str() + " is " + (c_.u_shape ? "not " : "") + "U-shaped, this run " +
                        (c_.u_shape ? "is" : "is not"));
    const std::string ek = key + ":epoch";
    const auto e = ck.meta.find(ek);
    if (e == ck.meta.end()) throw core::error(ek + " is missing");
    const std::uint64_t plan = count_of(e->second, ek);
    if (plan < 1 || plan > epoch_)
      throw core::error(ek + ": plan " + std::to_string(plan) + " is not between 1 and the checkpoint's plan " +
                        std::to_string(epoch_));
    rr.epoch = static_cast<std::uint32_t>(plan);
    resumed_routes_[static_cast<std::uint32_t>(dev)] = std::move(rr);
  }
  const auto first = ck.meta.lower_bound(std::string(book_prefix));
  if (first != ck.meta.end() && first->first.starts_with(book_prefix)) book_->read(ck.meta, book_prefix);
}

}  // namespace cleave::server
