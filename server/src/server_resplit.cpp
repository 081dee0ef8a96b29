// The server's adaptive splitting: profiles in, plans out, re-splits announced and carried out
// (Cutover, Migrate).
#include <algorithm>

#include "server_impl.h"

namespace cleave::server {

void server_node::impl::propose(std::uint32_t device, const split::route& r, const std::string& why) {
  auto& d = devices_.at(device);
  if (d.rs.next || !d.connected) return;
  d.rs.announce(r, ++plan_epoch_);
  spdlog::info("server: re-split device {} ({}): {} -> {} (plan {})", device, why, d.rs.route.str(), r.str(),
               d.rs.next_epoch);
  d.via->post(plan_message(device, true));
}

void server_node::impl::on_cutover(const runtime::session_ptr& s, const wire::Cutover& c) {
  const std::uint32_t dev = c.device_id();
  auto& d = attached(dev, s, "Cutover");
  const split::route from = d.rs.cut_over(c.epoch()), to = d.rs.route;
  if (round_.at == phase::collecting) ++round_.n_resplits;
  d.measured = false;
  d.moved_round = round_.number;
  const transport::migrate_desc md{d.rs.epoch, c.step(), dev, d.behind_edge ? s->id : 0, core::tier::server, 0};
  ex_.post_compute(
      [this, s, dev, from, to, md] {
        auto moved = runner_->rehost(dev, from, to, md);
        runtime::count_migration(ex_.metrics(), moved);
        for (auto& [tier, msg] : moved) s->post(std::move(msg));
      },
      [this, s, dev](const std::string& why) { device_failed(s, dev, why); });
}

void server_node::impl::on_migrate(const runtime::session_ptr& s, transport::message m) {
  const std::uint32_t dev = m.as<wire::Migrate>()->device_id();
  attached(dev, s, "Migrate");
  if (transport::tier_of(m.as<wire::Migrate>()->to_role()) != core::tier::server)
    throw core::error("Migrate not addressed to the server");
  auto held = std::make_shared<transport::message>(std::move(m));
  ex_.post_compute([this, dev, held] { runner_->install(dev, *held->as<wire::Migrate>()); },
                   [this, s, dev](const std::string& why) { device_failed(s, dev, why); });
}

void server_node::impl::on_profile(const runtime::session_ptr& s, const wire::Profile& m) {
  auto prof = transport::profile_of(m, model_.n_blocks());
  if (!book_) return;  // not splitting adaptively
  const std::uint32_t node = m.node_id();
  const split::node_key server{core::tier::server, 0};
  std::string about;
  if (s->role == core::tier::device || node != s->id) {
    // A device's own profile, directly or relayed by its edge.
    auto& d = attached(node, s, "profile");
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
  maybe_replan("profile of " + about);
}

void server_node::impl::publish_profile() {
  ex_.post_io([this, snap = runner_->snapshot(memory_budget_)]() mutable {
    if (book_) book_->set_profile({core::tier::server, 0}, std::move(snap));
  });
}

std::vector<split::profile_book::device_entry> server_node::impl::planned_devices() const {
  std::vector<split::profile_book::device_entry> out;
  for (const auto& [id, d] : devices_)
    if (d.connected) out.push_back({id, d.behind_edge ? d.via->id : 0, d.behind_edge});
  return out;
}

double server_node::impl::predicted_step(const std::set<std::uint32_t>& ids) {
  if (!book_) return 0;
  std::vector<split::profile_book::device_entry> devs;
  for (const auto& e : planned_devices())
    if (ids.count(e.id)) devs.push_back(e);
  std::string missing;
  const auto prob = book_->problem(devs, missing);
  if (!prob || devs.empty()) return 0;
  std::vector<split::route> routes;
  for (const auto& e : devs) routes.push_back(devices_.at(e.id).rs.route);
  try {
    return split::evaluate_plan(*prob, routes).step_seconds;
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
    if (devices_.at(e.id).rs.next || !devices_.at(e.id).measured) return;
  // This side's view of its links.
  for (const auto& s : acceptor_->sessions()) {
    const auto l = s->measured_link(s->id);
    book_->report_link({core::tier::server, 0}, {s->role, s->id}, l.rtt_us * 1e-6, l.bandwidth_bytes_per_s);
  }
  std::string missing;
  const auto prob = book_->problem(devs, missing);
  if (!prob) {
    spdlog::debug("server: no plan yet ({}): waiting for the profile of {}", why, missing);
    return;
  }
  std::vector<split::route> current;
  for (const auto& e : devs) current.push_back(devices_.at(e.id).rs.route);
  split::split_plan best;
  try {
    const auto t0 = clock::now();
    best = split::plan_best(*prob);
    round_.planner_s = std::max(round_.planner_s, std::chrono::duration<double>(clock::now() - t0).count());
  } catch (const core::error& e) {
    spdlog::warn("server: no plan fits ({}): {}", why, e.what());
    return;
  }
  split::resplit_policy policy;
  policy.min_gain = c_.min_gain;
  policy.repay_rounds = c_.repay_rounds;
  policy.steps_per_round = c_.local_steps;
  // Devices run the configured micro-batches with f32 cuts; the plan says how each could run.
  std::vector<split::route_choice> running;
  for (const auto& r : current) running.push_back(split::default_choice(*prob, r.path.size() - 1));
  const auto d = split::decide_resplit(*prob, current, running, best, policy);
  if (!d.change) {
    spdlog::debug("server: plan kept ({}): {}", why, d.reason);
    return;
  }
  spdlog::info("server: re-plan ({}): {}", why, d.reason);
  // Only the devices whose own step gains enough move (or whose route no longer fits): the
  // others would pay a migration for nothing the federation's step time sees.
  for (std::size_t i = 0; i < devs.size(); ++i) {
    if (best.routes[i] == current[i]) continue;
    const auto now = split::evaluate_route(*prob, static_cast<int>(i), current[i], running[i]);
    const double next = best.cost.devices[i].seconds;
    if (now.feasible && now.seconds - next < c_.min_gain * now.seconds) continue;
    propose(devs[i].id, best.routes[i], fmt::format("its step {:.1f} -> {:.1f} ms", now.seconds * 1e3, next * 1e3));
  }
}

}  // namespace cleave::server
