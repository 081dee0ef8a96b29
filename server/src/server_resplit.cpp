// The server's adaptive splitting: profiles in, plans out, re-splits announced and carried out
// (Cutover, Migrate).
#include <algorithm>

#include "server_impl.h"

namespace cleave::server {

void server_node::impl::propose(std::uint32_t device, const core::route& r, const std::string& why) {
  auto& d = devices_.at(device);
  if (d.next || !d.connected) return;
  d.next = r;
  d.next_epoch = ++plan_epoch_;
  spdlog::info("server: re-split device {} ({}): {} -> {} (plan {})", device, why, d.route.str(), r.str(),
               d.next_epoch);
  d.via->post(plan_message(device, true));
}

void server_node::impl::on_cutover(const runtime::session_ptr& s, const wire::Cutover& c) {
  const std::uint32_t dev = c.device_id();
  auto& d = attached(dev, s, "Cutover");
  if (!d.next || c.epoch() != d.next_epoch)
    throw core::error("Cutover of device " + std::to_string(dev) + " to plan " + std::to_string(c.epoch()) +
                      ", which was not announced");
  const core::route from = d.route, to = *d.next;
  d.route = to;
  d.epoch = d.next_epoch;
  d.next.reset();
  if (round_.at == phase::collecting) ++round_.n_resplits;
  d.measured = false;
  const transport::migrate_desc md{d.epoch, c.step(), dev, d.behind_edge ? s->id : 0, core::tier::server, 0};
  ex_.post_compute([this, s, dev, from, to, md] {
    try {
      for (auto& [tier, msg] : runner_->rehost(dev, from, to, md)) s->post(std::move(msg));
    } catch (const core::error& e) {
      device_failed(s, dev, e.what());
    }
  });
}

void server_node::impl::on_migrate(const runtime::session_ptr& s, transport::message m) {
  const std::uint32_t dev = m.as<wire::Migrate>()->device_id();
  attached(dev, s, "Migrate");
  if (transport::tier_of(m.as<wire::Migrate>()->to_role()) != core::tier::server)
    throw core::error("Migrate not addressed to the server");
  auto held = std::make_shared<transport::message>(std::move(m));
  ex_.post_compute([this, s, dev, held] {
    try {
      runner_->install(dev, *held->as<wire::Migrate>());
    } catch (const core::error& e) {
      device_failed(s, dev, e.what());
    }
  });
}

void server_node::impl::on_profile(const runtime::session_ptr& s, const wire::Profile& m) {
  auto prof = transport::profile_of(m, model_.n_blocks());
  if (!book_) return;  // not splitting adaptively
  const std::uint32_t node = m.node_id();
  const node_key server{transport::node_role::server, 0};
  std::string about;
  if (s->role == transport::node_role::device || node != s->id) {
    // A device's own profile, directly or relayed by its edge.
    auto& d = attached(node, s, "profile");
    const node_key dk{transport::node_role::device, node};
    const node_key up = d.behind_edge ? node_key{transport::node_role::edge, s->id} : server;
    for (const auto& l : prof.links) book_->report_link(dk, up, l.rtt_us * 1e-6, l.bandwidth_bytes_per_s);
    about = "device " + std::to_string(node);
    book_->set_profile(dk, std::move(prof));
    d.measured = true;
  } else {
    const node_key ek{transport::node_role::edge, node};
    for (const auto& l : prof.links) {
      const node_key peer_key = l.peer_id == 0 ? server : node_key{transport::node_role::device, l.peer_id};
      book_->report_link(ek, peer_key, l.rtt_us * 1e-6, l.bandwidth_bytes_per_s);
    }
    about = "edge " + std::to_string(node);
    book_->set_profile(ek, std::move(prof));
  }
  maybe_replan("profile of " + about);
}

void server_node::impl::publish_profile() {
  ex_.post_io([this, snap = runner_->snapshot(memory_budget_)]() mutable {
    if (book_) book_->set_profile({transport::node_role::server, 0}, std::move(snap));
  });
}

std::vector<profile_book::device_entry> server_node::impl::planned_devices() const {
  std::vector<profile_book::device_entry> out;
  for (const auto& [id, d] : devices_)
    if (d.connected) out.push_back({id, d.behind_edge ? d.via->id : 0, d.behind_edge});
  return out;
}

double server_node::impl::predicted_step(const std::set<std::uint32_t>& ids) {
  if (!book_) return 0;
  std::vector<profile_book::device_entry> devs;
  for (const auto& e : planned_devices())
    if (ids.count(e.id)) devs.push_back(e);
  std::string missing;
  const auto prob = book_->problem(devs, missing);
  if (!prob || devs.empty()) return 0;
  std::vector<core::route> routes;
  for (const auto& e : devs) routes.push_back(devices_.at(e.id).route);
  try {
    return core::evaluate_plan(*prob, routes).step_seconds;
  } catch (const core::error&) {
    return 0;
  }
}

void server_node::impl::maybe_replan(const std::string& why) {
  if (!c_.adaptive || c_.mode != training_mode::splitfed || ex_.stopping() || !book_) return;
  const auto devs = planned_devices();
  if (devs.empty()) return;
  // One re-split at a time, and the next only once every device has been measured under it.
  for (const auto& e : devs)
    if (devices_.at(e.id).next || !devices_.at(e.id).measured) return;
  // This side's view of its links.
  for (const auto& s : acceptor_->sessions()) {
    const auto l = s->measured_link(s->id);
    book_->report_link({transport::node_role::server, 0}, {s->role, s->id}, l.rtt_us * 1e-6, l.bandwidth_bytes_per_s);
  }
  std::string missing;
  const auto prob = book_->problem(devs, missing);
  if (!prob) {
    spdlog::debug("server: no plan yet ({}): waiting for the profile of {}", why, missing);
    return;
  }
  std::vector<core::route> current;
  for (const auto& e : devs) current.push_back(devices_.at(e.id).route);
  core::split_plan best;
  try {
    const auto t0 = clock::now();
    best = core::plan_best(*prob);
    round_.planner_s = std::max(round_.planner_s, std::chrono::duration<double>(clock::now() - t0).count());
  } catch (const core::error& e) {
    spdlog::warn("server: no plan fits ({}): {}", why, e.what());
    return;
  }
  core::resplit_policy policy;
  policy.min_gain = c_.min_gain;
  policy.repay_rounds = c_.repay_rounds;
  policy.steps_per_round = c_.local_steps;
  const auto d = core::decide_resplit(*prob, current, best, policy);
  if (!d.change) {
    spdlog::debug("server: plan kept ({}): {}", why, d.reason);
    return;
  }
  spdlog::info("server: re-plan ({}): {}", why, d.reason);
  // Only the devices whose own step gains enough move (or whose route no longer fits): the
  // others would pay a migration for nothing the federation's step time sees.
  for (std::size_t i = 0; i < devs.size(); ++i) {
    if (best.routes[i] == current[i]) continue;
    const auto now = core::evaluate_route(*prob, static_cast<int>(i), current[i]);
    const double next = best.cost.devices[i].seconds;
    if (now.feasible && now.seconds - next < c_.min_gain * now.seconds) continue;
    propose(devs[i].id, best.routes[i], fmt::format("its step {:.1f} -> {:.1f} ms", now.seconds * 1e3, next * 1e3));
  }
}

void server_node::impl::apply_caps(const runtime::session_ptr& s) {
  for (const auto& ev : link_events_)
    if (transport::name_matches(ev.b, s->identity)) s->ch.emulator().set(ev.caps);
}

void server_node::impl::apply_schedule(std::uint64_t round) {
  if (schedule_.empty()) return;
  for (const auto& ev : schedule_.at(static_cast<int>(round), c_.name)) {
    if (ev.what != transport::emulation_event::kind::link) continue;
    spdlog::info("server: {}", ev.str());
    link_events_.push_back(ev);
    for (const auto& s : acceptor_->sessions())
      if (transport::name_matches(ev.b, s->identity)) s->ch.emulator().set(ev.caps);
  }
}

}  // namespace cleave::server
