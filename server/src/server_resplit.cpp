// The server's adaptive splitting: profiles in, plans out, re-splits announced and carried out
// (Cutover, Migrate).
#include <algorithm>

#include "server_impl.h"

namespace cleave::server {

namespace {

// "int8/topk" per hop, hops joined by ','.
std::string codecs_text(const std::vector<core::hop_codecs>& hops) {
  std::string out;
  for (const auto& h : hops) {
    if (!out.empty()) out += ',';
    out += std::string(core::codec_name(h.up)) + "/" + std::string(core::codec_name(h.down));
  }
  return out;
}

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

void server_node::impl::measure_codecs() {
  codec_options_.clear();
  for (core::codec c : c_.codecs.allowed) codec_options_.push_back({c, codec_seconds_per_value(c_.codecs, c)});
  std::string text;
  for (const auto& o : codec_options_)
    text += fmt::format("{}{} {:.2f} ns", text.empty() ? "" : ", ", core::codec_name(o.id), o.seconds_per_value * 1e9);
  if (codec_options_.size() > 1)
    spdlog::info("server: cut codecs the planner may choose, per value encoded and decoded: {}", text);
}

void server_node::impl::add_choices(split::split_problem& p) const {
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

std::vector<split::route_choice> server_node::impl::running_choices(
    const std::vector<split::profile_book::device_entry>& devs) const {
  std::vector<split::route_choice> out;
  for (const auto& e : devs) {
    const auto& d = devices_.at(e.id);
    out.push_back({c_.micro_batches, cut_of(d.rs.route, &d.hops).hops});
  }
  return out;
}

void server_node::impl::propose(std::uint32_t device, const split::route& r, const std::vector<core::hop_codecs>& hops,
                                const std::string& why) {
  auto& d = devices_.at(device);
  if (d.rs.next || !d.connected) return;
  const std::string codecs_before = codecs_text(cut_of(d.rs.route, &d.hops).hops);
  d.rs.announce(r, ++plan_epoch_);
  d.next_hops = hops;
  const std::string codecs_after = codecs_text(cut_of(r, &d.next_hops).hops);
  spdlog::info("server: re-split device {} ({}): {} -> {}{} (plan {})", device, why, d.rs.route.str(), r.str(),
               codecs_before == codecs_after ? std::string() : ", codecs " + codecs_before + " -> " + codecs_after,
               d.rs.next_epoch);
  d.via->post(plan_message(device, true));
}

void server_node::impl::on_cutover(const runtime::session_ptr& s, const wire::Cutover& c) {
  const std::uint32_t dev = c.device_id();
  auto* at = attached(dev, s, "Cutover");
  if (!at) return;
  auto& d = *at;
  const split::route from = d.rs.cut_over(c.epoch()), to = d.rs.route;
  const auto steps = static_cast<std::uint64_t>(c_.local_steps);
  if (round_.at == phase::collecting) {
    ++round_.n_resplits;
    if (c.step() / steps == round_.number) d.legs.push_back({from, d.hops, c.step() % steps});
  }
  d.hops = std::move(d.next_hops);
  d.next_hops.clear();
  d.measured = false;
  d.moved_round = round_.number;
  const protocol::migrate_desc md{d.rs.epoch, c.step(), dev, d.behind_edge ? s->id : 0, core::tier::server, 0};
  ex_.post_compute(
      [this, s, dev, from, to, md, cut = cut_of(to, &d.hops)] {
        runner_->set_cut(dev, cut);
        auto moved = runner_->rehost(dev, from, to, md);
        runtime::count_migration(ex_.metrics(), moved);
        for (auto& [tier, msg] : moved) s->post(std::move(msg));
      },
      [this, s, dev](const std::string& why) { device_failed(s, dev, why); });
}

void server_node::impl::on_migrate(const runtime::session_ptr& s, transport::message m) {
  const std::uint32_t dev = m.as<wire::Migrate>()->device_id();
  if (!attached(dev, s, "Migrate")) return;
  if (protocol::tier_of(m.as<wire::Migrate>()->to_role()) != core::tier::server)
    throw core::error("Migrate not addressed to the server");
  auto held = std::make_shared<transport::message>(std::move(m));
  ex_.post_compute([this, dev, held] { runner_->install(dev, *held->as<wire::Migrate>()); },
                   [this, s, dev](const std::string& why) { device_failed(s, dev, why); });
}

void server_node::impl::on_profile(const runtime::session_ptr& s, const wire::Profile& m) {
  auto prof = protocol::profile_of(m, model_.n_blocks());
  if (!book_) return;  // not splitting adaptively
  const std::uint32_t node = m.node_id();
  const split::node_key server{core::tier::server, 0};
  std::string about;
  if (s->role == core::tier::device || node != s->id) {
    // A device's own profile, directly or relayed by its edge.
    auto* at = attached(node, s, "profile");
    if (!at) return;
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

std::map<std::uint32_t, double> server_node::impl::predicted_steps(const std::set<std::uint32_t>& ids) {
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
  for (const auto& e : devs) routes.push_back(devices_.at(e.id).rs.route);
  try {
    // All of them at once: each shares the server and its edge with the others, as in a round.
    const auto cost = split::evaluate_plan(*prob, routes, running_choices(devs));
    const double steps = static_cast<double>(c_.local_steps);
    for (std::size_t i = 0; i < devs.size(); ++i) {
      const auto& d = devices_.at(devs[i].id);
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

double server_node::impl::predicted_step(const std::set<std::uint32_t>& ids) {
  double most = 0;
  for (const auto& [id, s] : predicted_steps(ids)) most = std::max(most, s);
  return most;
}

void server_node::impl::maybe_replan(const std::string& why) {
  if (!c_.adaptive || c_.mode != training_mode::splitfed || ex_.stopping() || !book_) return;
  const auto devs = planned_devices();
  if (devs.empty()) return;
  // One re-split at a time per device, and its next only once it has been measured under it.
  // The others may move meanwhile: a device's cost depends on the others only through how many
  // share a node, not on their routes (see splitter.h), so its best route is its own.
  std::vector<bool> held(devs.size());
  for (std::size_t i = 0; i < devs.size(); ++i)
    held[i] = devices_.at(devs[i].id).rs.next || !devices_.at(devs[i].id).measured;
  if (std::all_of(held.begin(), held.end(), [](bool h) { return h; })) return;
  // This side's view of its links.
  for (const auto& s : acceptor_->sessions()) {
    const auto l = s->measured_link(s->id);
    book_->report_link({core::tier::server, 0}, {s->role, s->id}, l.rtt_us * 1e-6, l.bandwidth_bytes_per_s);
  }
  std::string missing;
  auto prob = book_->problem(devs, missing);
  if (!prob) {
    spdlog::debug("server: no plan yet ({}): waiting for {}", why, missing);
    return;
  }
  add_choices(*prob);
  std::vector<split::route> current;
  for (const auto& e : devs) current.push_back(devices_.at(e.id).rs.route);
  // How devices run now (the configured micro-batches, their hops' codecs); the plan says how
  // each could run.
  const auto running = running_choices(devs);
  split::split_plan best;
  try {
    const auto t0 = clock::now();
    best = split::plan_best(*prob);
    round_.planner_s = std::max(round_.planner_s, std::chrono::duration<double>(clock::now() - t0).count());
    // The held devices stay as they run.
    for (std::size_t i = 0; i < devs.size(); ++i)
      if (held[i]) {
        best.routes[i] = current[i];
        best.choices[i] = running[i];
      }
    best.cost = split::evaluate_plan(*prob, best.routes, best.choices);
  } catch (const core::error& e) {
    spdlog::warn("server: no plan fits ({}): {}", why, e.what());
    return;
  }
  split::resplit_policy policy;
  policy.min_gain = c_.min_gain;
  policy.repay_rounds = c_.repay_rounds;
  policy.steps_per_round = c_.local_steps;
  const auto d = split::decide_resplit(*prob, current, running, best, policy);
  if (!d.change) {
    spdlog::debug("server: plan kept ({}): {}", why, d.reason);
    return;
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
}

}  // namespace cleave::server
