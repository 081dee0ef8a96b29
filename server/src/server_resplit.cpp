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
  d.via->out->post(plan_message(device, true));
}

void server_node::impl::migration_failed(const std::shared_ptr<peer>& p, std::uint32_t dev, const std::string& why) {
  asio::post(io_, [this, p, dev, why] {
    if (p->role == transport::node_role::device)
      drop_peer(p, why);  // the device itself sent the bad blocks
    else
      device_gone(dev, why);  // its edge did: that device's training stops, the edge's others go on
  });
}

void server_node::impl::on_cutover(const std::shared_ptr<peer>& p, const wire::Cutover& c) {
  const std::uint32_t dev = c.device_id();
  const auto it = devices_.find(dev);
  if (it == devices_.end() || it->second.via != p || !it->second.connected)
    throw core::error("Cutover for device " + std::to_string(dev) + ", which is not attached through " + p->identity);
  auto& d = it->second;
  if (!d.next || c.epoch() != d.next_epoch)
    throw core::error("Cutover of device " + std::to_string(dev) + " to plan " + std::to_string(c.epoch()) +
                      ", which was not announced");
  const core::route from = d.route, to = *d.next;
  d.route = to;
  d.epoch = d.next_epoch;
  d.next.reset();
  if (round_open_) ++n_resplits_;
  d.measured = false;
  const std::uint32_t epoch = d.epoch;
  const std::uint64_t step = c.step();
  const std::uint32_t edge = d.behind_edge ? d.via->id : 0;
  auto out = p->out;
  asio::post(work_, [this, dev, from, to, epoch, step, edge, out, p] {
    try {
      const transport::migrate_desc md{epoch, step, dev, edge, core::tier::server, 0};
      for (const auto& bs : host_->rehost(dev, from, to, core::tier::server))
        out->post(transport::make_migrate(md, to, bs));
      held_.release(*host_, dev);
    } catch (const core::error& e) {
      migration_failed(p, dev, e.what());
    }
  });
}

void server_node::impl::on_profile(const std::shared_ptr<peer>& p, const wire::Profile& m) {
  auto prof = transport::profile_of(m, model_.n_blocks());
  if (!book_) return;  // not splitting adaptively
  const std::uint32_t node = m.node_id();
  const node_key server{transport::node_role::server, 0};
  std::string about;
  if (p->role == transport::node_role::device || node != p->id) {
    // A device's own profile, directly or relayed by its edge.
    const auto it = devices_.find(node);
    if (it == devices_.end() || it->second.via != p)
      throw core::error("profile of device " + std::to_string(node) + ", which is not attached through " + p->identity);
    const node_key dk{transport::node_role::device, node};
    const node_key up = it->second.behind_edge ? node_key{transport::node_role::edge, p->id} : server;
    for (const auto& l : prof.links) book_->report_link(dk, up, l.rtt_us * 1e-6, l.bandwidth_bytes_per_s);
    about = "device " + std::to_string(node);
    book_->set_profile(dk, std::move(prof));
    it->second.measured = true;
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

std::vector<profile_book::device_entry> server_node::impl::planned_devices() const {
  std::vector<profile_book::device_entry> out;
  for (const auto& [id, d] : devices_)
    if (d.connected) out.push_back({id, d.behind_edge ? d.via->id : 0, d.behind_edge});
  return out;
}

double server_node::impl::predicted_step(const std::vector<std::uint32_t>& ids) {
  if (!book_) return 0;
  std::vector<profile_book::device_entry> devs;
  for (const auto& e : planned_devices())
    if (std::find(ids.begin(), ids.end(), e.id) != ids.end()) devs.push_back(e);
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
  if (!c_.adaptive || c_.mode != training_mode::splitfed || stopping_ || !book_) return;
  const auto devs = planned_devices();
  if (devs.empty()) return;
  // One re-split at a time, and the next only once every device has been measured under it.
  for (const auto& e : devs)
    if (devices_.at(e.id).next || !devices_.at(e.id).measured) return;
  // This side's view of its links.
  for (const auto& p : peers_) {
    if (!p->alive) continue;
    const auto st = p->ch.stats();
    book_->report_link({transport::node_role::server, 0}, {p->role, p->id}, transport::link_rtt_us(st) * 1e-6,
                       transport::link_bytes_per_second(st));
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
    planner_s_ = std::max(planner_s_, std::chrono::duration<double>(clock::now() - t0).count());
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

void server_node::impl::reprofile_if_idle() {
  if (n_observed_ != n_observed_mark_) {
    n_observed_mark_ = n_observed_;
    return;
  }
  // No block of the model ran here: without fresh timings the plans would rest on the figures
  // of the start, whatever the load has become since.
  core::profile_options po;
  po.batch = static_cast<int>(profile_batch_);
  po.seed = c_.seed;
  live_ = core::live_profile(core::profile_blocks(*be_, model_, c_.opt, po));
  auto snap = transport::current_profile(live_, 0, profile_batch_, be_->name(), memory_budget_);
  asio::post(io_, [this, snap = std::move(snap)]() mutable {
    book_->set_profile({transport::node_role::server, 0}, std::move(snap));
  });
}

void server_node::impl::apply_caps(const std::shared_ptr<peer>& p) {
  for (const auto& ev : link_events_)
    if (transport::name_matches(ev.b, p->identity)) p->ch.emulator().set(ev.caps);
}

void server_node::impl::apply_schedule(std::uint64_t round) {
  if (schedule_.empty()) return;
  for (const auto& ev : schedule_.at(static_cast<int>(round), c_.name)) {
    if (ev.what != transport::emulation_event::kind::link) continue;
    spdlog::info("server: {}", ev.str());
    link_events_.push_back(ev);
    for (const auto& p : peers_)
      if (p->alive && transport::name_matches(ev.b, p->identity)) p->ch.emulator().set(ev.caps);
  }
}

void server_node::impl::on_migrate(const std::shared_ptr<peer>& p, const wire::Migrate& m) {
  const std::uint32_t dev = m.device_id();
  const auto it = devices_.find(dev);
  if (it == devices_.end() || it->second.via != p || !it->second.connected)
    throw core::error("Migrate for device " + std::to_string(dev) + ", which is not attached through " + p->identity);
  if (transport::tier_of(m.to_role()) != core::tier::server) throw core::error("Migrate not addressed to the server");
  auto st = std::make_shared<core::block_state>(transport::block_state_of(m, model_));
  asio::post(work_, [this, dev, st, p] {
    try {
      host_->install_blocks(dev, std::move(*st));
      held_.release(*host_, dev);
    } catch (const core::error& e) {
      migration_failed(p, dev, e.what());
    }
  });
}

}  // namespace cleave::server
