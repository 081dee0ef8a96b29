// The server's plans and its adaptive splitter: routes and cut settings, profiles in, plans out,
// re-splits announced and cut over, the splitter's part of a checkpoint.
#include "splitter.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "cleave/core/clock.h"

namespace cleave::server {

namespace {

constexpr std::string_view book_prefix = "book:";

// The blocks a device keeps at least: --min-device-blocks, and for planned routes (the planner's,
// default cuts) as many as hold a layer with parameters. Configured cuts are the operator's (a
// device refuses what it must).
int min_device_blocks(const server_config& c, const core::model_spec& m, bool planned) {
  if (!planned) return c.min_device_blocks;
  const int most = c.u_shape ? m.n_blocks() - 1 : m.n_blocks();
  return std::max(c.min_device_blocks, std::min(split::trained_bottom(m), most));
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
  p.min_device_blocks = min_device_blocks(c_, model_, true);
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
                       const move_why& why) {
  auto& d = *members_.find(device);
  if (d.rs.next || !d.connected) return;
  if (in_round_ && in_round_() && split::takes_off_device(d.rs.route, r)) {
    if (const auto it = deferred_.find(device); it == deferred_.end() || !(it->second.to == r))
      spdlog::info(
          "server: re-split of device {} ({}) to {} waits for the next round (blocks leave a device only "
          "between rounds under secure aggregation)",
          device, why.text, r.str());
    deferred_[device] = {r, hops, why};
    return;
  }
  deferred_.erase(device);
  const std::string codecs_before = codecs_text(cut_of(d.rs.route, &d.hops).hops);
  d.rs.announce(r, ++epoch_);
  d.next_hops = hops;
  const std::string codecs_after = codecs_text(cut_of(r, &d.next_hops).hops);
  spdlog::info("server: re-split device {} ({}): {} -> {}{} (plan {})", device, why.text, d.rs.route.str(), r.str(),
               codecs_before == codecs_after ? std::string() : ", codecs " + codecs_before + " -> " + codecs_after,
               d.rs.next_epoch);
  if (cuts_.size() == max_cut_events) cuts_.pop_front();
  cuts_.push_back({++n_cuts_, core::unix_now(), device, d.rs.route.str(), r.str(), why});
  d.via->post(plan_message(device, true));
}

void splitter::release_deferred() {
  auto moves = std::move(deferred_);
  deferred_.clear();
  for (const auto& [id, m] : moves)
    if (const auto* d = members_.find(id); d && d->connected)
      propose(id, m.to, m.hops, {m.why.text + ", at the round's end", m.why.step_before, m.why.step_after});
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

std::map<std::uint32_t, double> splitter::predicted_steps(const std::set<std::uint32_t>& ids,
                                                          std::vector<round_report::leg>* legs_out) {
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
    for (std::size_t i = 0; i < devs.size(); ++i) {
      std::vector<split::plan_leg> legs;
      for (const auto& l : members_.find(devs[i].id)->legs)
        legs.push_back({l.route, {c_.micro_batches, cut_of(l.route, &l.hops).hops}, l.until});
      const auto priced = split::price_legs(*prob, static_cast<int>(i), legs, routes[i], cost.devices[i].seconds,
                                            static_cast<std::uint64_t>(c_.local_steps));
      out[devs[i].id] = split::mean_step_seconds(priced, static_cast<std::uint64_t>(c_.local_steps));
      if (legs_out && priced.size() > 1)
        for (const auto& l : priced)
          legs_out->push_back({devs[i].id, l.r.str(), l.steps, l.step_seconds, l.migration_seconds});
    }
  } catch (const core::error&) {
    out.clear();
  }
  return out;
}

double splitter::predicted_step(const std::set<std::uint32_t>& ids, std::vector<round_report::leg>* legs) {
  double most = 0;
  for (const auto& [id, s] : predicted_steps(ids, legs)) most = std::max(most, s);
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
  std::vector<split::running_device> running;
  const auto choices = running_choices(devs);
  for (std::size_t i = 0; i < devs.size(); ++i)
    running.push_back({members_.find(devs[i].id)->rs.route, choices[i], held[i]});
  split::resplit_policy policy{c_.min_gain, c_.repay_rounds, c_.local_steps};
  const auto plan = split::replan(*prob, running, policy, c_.secure_aggregation ? c_.secagg_min_holders : 1);
  if (!plan.no_fit.empty()) {
    spdlog::warn("server: no plan fits ({}): {}", why, plan.no_fit);
  } else if (!plan.decision.change) {
    spdlog::debug("server: plan kept ({}): {}", why, plan.decision.reason);
  } else {
    spdlog::info("server: re-plan ({}): {}", why, plan.decision.reason);
    for (const auto& m : plan.moves)
      propose(devs[m.device].id, m.to, m.hops,
              {fmt::format("its step {:.1f} -> {:.1f} ms", m.now_seconds * 1e3, m.next_seconds * 1e3), m.now_seconds,
               m.next_seconds});
  }
  return plan.planner_seconds;
}

void splitter::start(split::node_profile server) {
  book_ = std::make_unique<split::profile_book>(model_, std::max(1, c_.batch / c_.micro_batches), c_.micro_batches,
                                                c_.u_shape);
  book_->set_profile({core::tier::server, 0}, std::move(server));
  measure_codecs();
}

split::route splitter::route_for_device(bool behind_edge) const {
  const auto& cuts = behind_edge ? c_.edge_cuts : c_.cuts;
  return split::starting_route(model_, c_.u_shape, behind_edge, cuts, min_device_blocks(c_, model_, cuts.empty()),
                               behind_edge ? "--edge-cuts" : "--cuts");
}

std::string splitter::place(std::uint32_t id, device_state& d) {
  d.rs.reset(route_for_device(d.behind_edge), epoch_);
  const auto it = resumed_routes_.find(id);
  if (it == resumed_routes_.end()) return {};
  if (it->second.r.has_edge() == d.behind_edge) {
    // Its route before the restart, under the same plan epoch and run: its segments and theirs
    // on the way keep their state.
    d.rs.reset(it->second.r, it->second.epoch);
    return fmt::format(", its route at the checkpoint (plan {})", it->second.epoch);
  }
  spdlog::warn(
      "server: device {} rejoined {}; its route at the checkpoint ({}) is not for that, the configured cuts apply", id,
      d.behind_edge ? "behind an edge" : "directly", it->second.r.str());
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
  p.dataset = c_.dataset;
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
  std::map<std::uint32_t, split::epoch_route> in_force;
  for (const auto& [id, d] : members_.all())
    if (d.connected || std::any_of(routes.begin(), routes.end(), [id = id](const auto& r) { return r.first == id; }))
      in_force[id] = {d.rs.route, d.rs.epoch};
  split::write_routes(m, in_force);
  if (book_) book_->write(m, book_prefix);
  return m;
}

std::string splitter::resumed_text() const {
  if (!book_) return {};
  std::string routes;
  for (const auto& [id, r] : resumed_routes_)
    routes += fmt::format("{}device {} {} (plan {})", routes.empty() ? "" : ", ", id, r.r.str(), r.epoch);
  return fmt::format("; the splitter's book of {} node{} and {} link{}, routes: {}", book_->profiles().size(),
                     book_->profiles().size() == 1 ? "" : "s", book_->links().size(),
                     book_->links().size() == 1 ? "" : "s", routes.empty() ? "none" : routes);
}

void splitter::resume(const core::checkpoint& ck, std::uint32_t epoch) {
  epoch_ = epoch;
  // A checkpoint of a fixed plan, or of a server that did not split adaptively, stores neither
  // routes worth restoring nor a book: the configured cuts and fresh profiles then.
  if (!book_) return;
  resumed_routes_ = split::read_routes(ck.meta, model_.n_blocks(), c_.u_shape, epoch_);
  const auto first = ck.meta.lower_bound(std::string(book_prefix));
  if (first != ck.meta.end() && first->first.starts_with(book_prefix)) book_->read(ck.meta, book_prefix);
}

}  // namespace cleave::server
