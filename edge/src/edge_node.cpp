// The edge node on the node runtime: devices below (an acceptor), the server above (an upstream
// link); the I/O thread relays and keeps the books, the segment runner computes.

#include "cleave/backend/registry.h"
#include "cleave/runtime/node_metrics.h"
#include "edge_impl.h"

namespace cleave::edge {

edge_node::edge_node(edge_config c) : impl_(std::make_unique<impl>(std::move(c))) {}
edge_node::~edge_node() = default;
int edge_node::run() {
  return impl_->run();
}
void edge_node::stop() {
  impl_->stop();
}
void edge_node::stop_on_signals() {
  impl_->stop_on_signals();
}
std::uint16_t edge_node::port() const {
  return impl_->port_.load();
}

void edge_node::impl::on_server(transport::message m) {
  switch (m.type()) {
    case wire::Body::Welcome: {
      const auto* w = m.as<wire::Welcome>();
      if (w->node_id() != c_.id) {
        relay_down(w->node_id(), m);
        if (const auto it = devices_.find(w->node_id()); it != devices_.end() && it->second.s)
          runtime::send_revocations(*tls_, it->second.s);
        return;
      }
      per_device_ = w->per_device_replicas();
      if (per_device_) spdlog::info("edge {}: the server aggregates each device's own replicas: no pre-average", c_.id);
      return;
    }
    case wire::Body::Plan:
      on_plan(m);
      return;
    case wire::Body::GlobalWeights: {
      if (model_json_.empty()) return;  // no device here yet: nothing to install or pass on
      const auto& g = *m.as<wire::GlobalWeights>();
      protocol::weights_of(g, model_);  // checked here, where a bad one drops the link
      std::vector<std::pair<std::uint32_t, split::route>> targets;
      for (auto& [id, d] : devices_)
        if (d.planned && (g.device_id() == 0 || g.device_id() == id)) {
          targets.emplace_back(id, d.rs.route);
          relay_down(id, m);
        }
      auto held = std::make_shared<transport::message>(std::move(m));
      ex_.post_compute([this, targets, held] {
        const auto w = protocol::weights_of(*held->as<wire::GlobalWeights>(), runner_->model());
        for (const auto& [id, r] : targets) runner_->load(id, r, w.params, w.buffers);
      });
      return;
    }
    case wire::Body::RoundStart:
      return on_round_start(*m.as<wire::RoundStart>());
    case wire::Body::Migrate: {
      const auto& mg = *m.as<wire::Migrate>();
      const auto it = devices_.find(mg.device_id());
      if (it == devices_.end() || !it->second.planned || !it->second.s) return;
      const auto to = protocol::tier_of(mg.to_role());
      if (to == core::tier::server) throw core::error("Migrate from the server addressed to the server");
      if (to == core::tier::device) return relay_down(mg.device_id(), m);
      return install(it->second.s, std::move(m));
    }
    case wire::Body::Activations:
    case wire::Body::Gradients:
      return step(protocol::step_key_of(m)->device_id, std::move(m), core::tier::server);
    case wire::Body::Leave: {  // the server refused a device
      const auto* l = m.as<wire::Leave>();
      const auto it = devices_.find(l->node_id());
      if (it == devices_.end() || !it->second.s) return;
      it->second.s->post(transport::make_error(wire::ErrorCode::refused, l->reason() ? l->reason()->str() : ""));
      below_->close(it->second.s, "refused by the server");
      return;
    }
    case wire::Body::SecAgg:
      return relay_down(m.as<wire::SecAgg>()->device_id(), m);
    case wire::Body::Revocations:
      return runtime::adopt_revocations(ex_, *tls_, &*below_, &*up_, *m.as<wire::Revocations>());
    case wire::Body::Ping:
    case wire::Body::Pong:
      return;
    default:
      throw core::error("unexpected " + std::string(transport::body_name(m.type())));
  }
}

void edge_node::impl::relay_down(std::uint32_t dev, const transport::message& m) {
  const auto it = devices_.find(dev);
  if (it != devices_.end() && it->second.s) it->second.s->post(protocol::copy_of(m));
}

void edge_node::impl::on_plan(const transport::message& m) {
  const auto& p = *m.as<wire::Plan>();
  const std::string json = p.model() ? p.model()->str() : "";
  const auto training = protocol::training_of(p);
  batch_ = static_cast<std::uint64_t>(p.micro_batch_size()) * std::max(1u, p.n_micro_batches());
  if (json != model_json_) {
    model_ = core::parse_model_spec(json, "plan");
    model_json_ = json;
    ex_.post_compute([this, json, training, batch = p.micro_batch_size()] {
      runner_->set_model(json, training);
      runner_->profile(batch, training, memory_budget_);
      auto snap = runner_->snapshot(memory_budget_);
      ex_.post_io([this, snap = std::move(snap)]() mutable { send_profile(std::move(snap)); });
    });
  }
  secure_ = p.secure_aggregation();
  if (c_.secure_aggregation && !secure_) {
    ex_.fail(std::make_exception_ptr(core::error(
                 "the server does not aggregate securely (its devices would upload their replicas in the clear "
                 "through this edge), and this edge runs with --secure-aggregation")),
             "relaying");
    return;
  }
  const std::uint64_t previous_run = std::exchange(run_id_, p.run_id());
  for (const auto* dp : *p.devices()) {
    const std::uint32_t id = dp->device_id();
    const auto it = devices_.find(id);
    if (it == devices_.end() || !it->second.s) continue;
    const split::route r = protocol::route_for(p, id, model_.n_blocks());
    ex_.post_compute([this, id, cut = protocol::cut_settings_for(p, id, r)] { runner_->set_cut(id, cut); });
    auto& st = it->second;
    if (p.resplit() && st.planned) {
      st.rs.announce(r, p.epoch());
    } else {
      // Resuming from the server's checkpoint under the same run and route, its segments keep
      // their state; any other plan starts them afresh, as the server does.
      const bool same_run =
          st.planned && p.resume() && p.run_id() != 0 && p.run_id() == previous_run && st.rs.route == r;
      st.rs.reset(r, p.epoch());
      st.planned = true;
      ex_.post_compute([this, id, r, same_run] {
        runner_->discard(id, !same_run);
        if (same_run) return;
        started_.erase(id);
        for (int seg : r.segments_on(core::tier::edge)) runner_->host().host(id, r, seg);
      });
    }
    st.s->post(protocol::copy_of(m));
  }
}

void edge_node::impl::on_round_start(const wire::RoundStart& r) {
  const bool new_round = r.round() != round_ || r.attempt() != attempt_;
  if (new_round) {
    if (round_ > 0)
      ex_.post_compute([this] {
        if (runner_->has_model() && runner_->reprofile_if_idle()) {
          auto snap = runner_->snapshot(memory_budget_);
          ex_.post_io([this, snap = std::move(snap)]() mutable { send_profile(std::move(snap)); });
        }
      });
    round_ = r.round();
    attempt_ = r.attempt();
    auto open = below_->open();
    open.push_back(up_->current());
    runtime::advance_schedule(*schedule_, round_, open, ex_, runner_);
  }
  local_steps_ = r.local_steps();
  if (new_round || !collecting_ || flushing_) {
    // A new round, or in sequential mode a device's turn after the last one went up (or while it
    // does: its device left, the server moved on): the replicas of the devices here the server
    // now waits for are pre-averaged.
    ++turn_;
    collecting_ = true;
    flushing_ = false;
    uploads_ = runtime::upload_collector({local_steps_ * batch_, secure_, per_device_});
    arrived_.clear();
    bytes_mark_ = below_->bytes_moved();
    for (auto& [id, d] : devices_) {
      d.expected = false;
      d.parts.clear();
    }
    if (r.devices())
      for (auto id : *r.devices())
        if (const auto it = devices_.find(id); it != devices_.end() && it->second.s) it->second.expected = true;
    patience_ = std::chrono::milliseconds(static_cast<long>(static_cast<double>(r.deadline_ms()) * 0.9));
    silence_ = runtime::silence_allowed(std::chrono::milliseconds(r.deadline_ms()));
    for (auto& [id, d] : devices_) d.heard = clock::now();
    ex_.spawn(count_out_silent(turn_), "watching for silent devices");
    ex_.post_compute([this] { runner_->take_compute_seconds(); });
  }
  if (r.learning_rate() > 0)  // 0: the server keeps the plan's rate
    ex_.post_compute([this, id = r.device_id(), lr = r.learning_rate()] { runner_->host().set_learning_rate(id, lr); });
  if (const auto it = devices_.find(r.device_id()); it != devices_.end() && it->second.planned)
    ex_.post_compute(ex_.guarded(
        [this, id = r.device_id(), round = r.round(), route = it->second.rs.route] {
          auto& st = started_[id];
          if (st.round == round && st.route == route)
            runner_->restore_optimizer(id, route, st.optimizer);
          else
            st = round_start{round, route, runner_->optimizer_states(id, route)};
        },
        [this, id = r.device_id()](const std::string& why) {
          spdlog::warn("edge {}: device {}: the state its round started from is not restored: {}", c_.id, id, why);
        }));
  const auto it = devices_.find(r.device_id());
  if (it != devices_.end() && it->second.s) {
    protocol::round_start_desc rs{r.round(),     r.epoch(), r.local_steps(), r.deadline_ms(), r.learning_rate(),
                                  r.device_id(), {},        r.attempt()};
    it->second.s->post(protocol::make_round_start(rs));
  }
  // Flush at the latest at 90% of the server's deadline, with the devices that finished by then:
  // the server closes the round at its deadline whatever came in meanwhile.
  flush_timer_.expires_after(patience_);
  flush_timer_.async_wait([this, turn = turn_](std::error_code ec) {
    if (!ec && collecting_ && turn_ == turn) maybe_flush(true);
  });
}

void edge_node::impl::on_hello(const runtime::session_ptr& s, const transport::message& hello) {
  if (s->role != core::tier::device) throw core::error("only devices connect to an edge");
  auto& d = devices_[s->id];
  if (d.s) {
    // The same device on a new connection: the old one is half-open or about to close.
    if (d.s->identity != s->identity)
      throw core::error("device id " + std::to_string(s->id) + " is already connected here as " + d.s->identity);
    spdlog::warn("edge {}: device {} reconnected; its older connection is superseded", c_.id, s->id);
    const auto old = d.s;
    d.s = nullptr;
    below_->close(old, "superseded by a newer connection");
  }
  d.s = s;
  const bool was_expected = d.expected;
  d.planned = d.expected = false;
  d.parts.clear();
  uploads_.forget(s->id);
  // Named up by its certificate, not by what it claims.
  const auto named = protocol::renamed_hello(*hello.as<wire::Hello>(), s->identity);
  d.hello.assign(named.frame().begin(), named.frame().end());
  spdlog::info("edge {}: device {} ({}) connected", c_.id, s->id, s->identity);
  schedule_->apply(s->ch, s->identity);
  up_->post(transport::message_builder::from_frame(d.hello));
  // Back on a new connection, it is out of the round (the server counts it out too): the round
  // here may be complete without it.
  if (was_expected) maybe_flush(false);
}

void edge_node::impl::on_device_closed(const runtime::session_ptr& s, const std::string& why) {
  const auto it = devices_.find(s->id);
  if (it == devices_.end() || it->second.s != s) return;  // a superseded connection: nothing changes
  spdlog::warn("edge {}: device {} disconnected: {}", c_.id, s->id, why);
  it->second.s = nullptr;
  it->second.planned = false;
  ex_.post_compute([this, id = s->id] {
    if (runner_->has_model()) runner_->discard(id, true);
  });
  up_->post(protocol::make_leave({s->id, why}));
  maybe_flush(false);
}

void edge_node::impl::on_device(const runtime::session_ptr& s, transport::message m) {
  auto& d = devices_.at(s->id);
  d.heard = clock::now();
  switch (m.type()) {
    case wire::Body::Activations:
    case wire::Body::Gradients:
      if (protocol::step_key_of(m)->device_id != s->id) throw core::error("step message for another device");
      return step(s->id, std::move(m), core::tier::device);
    case wire::Body::ReplicaUpload:
      return on_replica(d, *m.as<wire::ReplicaUpload>());
    case wire::Body::Migrate: {
      const auto& mg = *m.as<wire::Migrate>();
      if (mg.device_id() != s->id || protocol::tier_of(mg.from_role()) != core::tier::device)
        throw core::error("Migrate for another device");
      const auto to = protocol::tier_of(mg.to_role());
      if (to == core::tier::device) throw core::error("Migrate from a device addressed to a device");
      if (to == core::tier::server) {
        up_->post(protocol::copy_of(m));
        return;
      }
      return install(s, std::move(m));
    }
    case wire::Body::Cutover:
      return on_cutover(d, m);
    case wire::Body::Profile:
      if (m.as<wire::Profile>()->node_id() != s->id) throw core::error("profile of another node");
      up_->post(protocol::copy_of(m));
      // A device holding every block sends no steps through here, only its profiles.
      return report_moved_links(d);
    case wire::Body::SecAgg:
      if (m.as<wire::SecAgg>()->device_id() != s->id) throw core::error("secure aggregation message of another device");
      up_->post(protocol::copy_of(m));
      return;
    default:
      throw core::error("unexpected " + std::string(transport::body_name(m.type())) + " from a device");
  }
}

void edge_node::impl::on_cutover(device_state& d, const transport::message& m) {
  const auto& c = *m.as<wire::Cutover>();
  if (c.device_id() != d.s->id) throw core::error("Cutover of another device");
  const split::route from = d.rs.cut_over(c.epoch()), to = d.rs.route;
  const protocol::migrate_desc md{d.rs.epoch, c.step(), d.s->id, c_.id, core::tier::edge, c_.id};
  auto cutover = std::make_shared<transport::message_builder>(protocol::copy_of(m));
  ex_.post_compute(ex_.guarded(
      [this, s = d.s, from, to, md, cutover] {
        auto moved = runner_->rehost(s->id, from, to, md);
        runtime::count_migration(ex_.metrics(), moved);
        for (auto& [tier, msg] : moved)
          tier == core::tier::device ? s->post(std::move(msg)) : up_->post(std::move(msg));
        // After this edge's own blocks, so the server has them when it re-hosts.
        up_->post(std::move(*cutover));
      },
      [this, s = d.s](const std::string& why) { below_->close(s, why); }));
}

void edge_node::impl::step(std::uint32_t dev, transport::message m, core::tier from) {
  const auto it = devices_.find(dev);
  if (it == devices_.end() || !it->second.planned || !it->second.s) return;  // gone meanwhile
  const auto& d = it->second;
  const auto key = *protocol::step_key_of(m);
  const std::uint32_t epoch = key.epoch;
  if (epoch != d.rs.epoch) {
    // From the server: computed before the device joined again or cut over, and late; the link
    // to the server, which carries every device's steps, stays.
    if (from == core::tier::server)
      return spdlog::debug("edge {}: a step message of plan {} for device {} (now plan {}) is dropped", c_.id, epoch,
                           dev, d.rs.epoch);
    return below_->close(d.s, "step message of plan " + std::to_string(epoch) + ", now " + std::to_string(d.rs.epoch));
  }
  // Of an attempt at the round that is over (it runs again): late, from either side.
  if (key.attempt != attempt_)
    return spdlog::debug("edge {}: a step message of attempt {} for device {} (now attempt {}) is dropped", c_.id,
                         key.attempt, dev, attempt_);
  report_moved_links(d);
  // A device's activation of the round collecting: evidence of its work there.
  if (from == core::tier::device && m.type() == wire::Body::Activations && collecting_ && !flushing_ && local_steps_ &&
      key.step / local_steps_ == round_)
    uploads_.saw(dev);
  auto held = std::make_shared<transport::message>(std::move(m));
  auto task = [this, s = d.s, r = d.rs.route, epoch, from, held] {
    auto res = runner_->run(s->id, r, epoch, from, *held);
    if (res.out) res.to == core::tier::server ? up_->post(std::move(*res.out)) : s->post(std::move(*res.out));
    // Profiles go up at a steady pace, also when only relaying (their links' figures count).
    if (res.stepped && runner_->profiled() && ++n_steps_ % std::max(1, c_.profile_every) == 0)
      ex_.post_io([this, snap = runner_->snapshot(memory_budget_)]() mutable { send_profile(std::move(snap)); });
  };
  auto guarded = ex_.guarded(std::move(task), [this, s = d.s](const std::string& why) { below_->close(s, why); });
  ex_.post_compute([this, dev, task = std::move(guarded)] { runner_->submit(dev, task); });
}

void edge_node::impl::report_moved_links(const device_state& d) {
  const auto up = up_->current();
  if (latest_profile_ &&
      (runtime::bandwidth_moved(d.reported_bps, d.s->measured_link(d.s->id).bandwidth_bytes_per_s) ||
       (up && runtime::bandwidth_moved(up_reported_bps_, up->measured_link(0).bandwidth_bytes_per_s))))
    send_profile(*latest_profile_);
}

void edge_node::impl::install(const runtime::session_ptr& s, transport::message m) {
  auto held = std::make_shared<transport::message>(std::move(m));
  ex_.post_compute(ex_.guarded([this, held, s] { runner_->install(s->id, *held->as<wire::Migrate>()); },
                               [this, s](const std::string& why) { below_->close(s, why); }));
}

void edge_node::impl::send_profile(split::node_profile prof) {
  latest_profile_ = prof;
  for (const auto& s : below_->sessions()) {
    prof.links.push_back(s->measured_link(s->id));
    if (const auto it = devices_.find(s->id); it != devices_.end())
      it->second.reported_bps = prof.links.back().bandwidth_bytes_per_s;
  }
  if (const auto s = up_->current()) {
    prof.links.push_back(s->measured_link(0));
    up_reported_bps_ = prof.links.back().bandwidth_bytes_per_s;
  }
  up_->post(protocol::make_profile(prof, 0, 0));
}

void edge_node::impl::on_upstream_connected(const runtime::session_ptr& s) {
  protocol::hello_info h;
  h.role = core::tier::edge;
  h.node_id = c_.id;
  h.name = c_.name;
  s->post(protocol::make_hello(h));
  if (latest_profile_) send_profile(*latest_profile_);
  schedule_->apply(s->ch, s->identity);
  // Devices already here are announced again (the server may have restarted).
  for (auto& [id, d] : devices_)
    if (d.s) s->post(transport::message_builder::from_frame(d.hello));
}

int edge_node::impl::run() {
  schedule_.emplace(c_.schedule, c_.name, ex_.who());  // configuration errors first
  tls_.emplace(transport::tls_files_in(c_.certs, c_.name));
  be_ = backend::make_backend(c_.backend);
  memory_budget_ = c_.memory_budget ? c_.memory_budget : split::default_memory_budget();
  runner_.emplace(*be_, core::tier::edge, c_.id, schedule_->start_slowdown(1.0));
  below_.emplace(ex_, *tls_, c_.listen_host, c_.port, c_.allowed, c_.links,
                 runtime::acceptor::handlers{
                     [this](const runtime::session_ptr& s, const transport::message& h) { on_hello(s, h); },
                     [this](const runtime::session_ptr& s, transport::message m) { on_device(s, std::move(m)); },
                     [this](const runtime::session_ptr& s, const std::string& why) { on_device_closed(s, why); }});
  port_.store(below_->port());
  up_.emplace(ex_, *tls_, c_.upstream_host, c_.upstream_port, c_.upstream_name, std::vector{core::tier::server},
              c_.links,
              runtime::upstream::handlers{[this](const runtime::session_ptr& s) { on_upstream_connected(s); },
                                          [this](transport::message m) { on_server(std::move(m)); },
                                          [this](const std::string&) { collecting_ = false; }});
  spdlog::info("edge {} ({}): backend {} ({}); devices connect to {}:{}; server at {}:{}", c_.id, c_.name, be_->name(),
               be_->device_name(), c_.listen_host, below_->port(), c_.upstream_host, c_.upstream_port);
  ex_.collect_on_io([this] {
    below_->publish_links();
    up_->publish_links();
    ex_.metrics().set("cleave_devices_connected", {}, static_cast<double>(below_->sessions().size()));
  });
  if (!c_.metrics.empty())
    ex_.serve_metrics(c_, [this] { return up_->current() ? std::string() : "not connected to the server"; });
  ex_.on_reload([this] { runtime::reload_credentials(ex_, *tls_, &*below_, &*up_); });
  ex_.on_shutdown([this](std::string why) -> asio::awaitable<void> {
    spdlog::info("edge {}: {}", c_.id, why.empty() ? "done" : why);
    flush_timer_.cancel();
    for (const auto& s : below_->sessions()) s->post(transport::make_error(wire::ErrorCode::shutting_down, why));
    co_await below_->shutdown();
    co_await up_->shutdown();
  });
  ex_.spawn(up_->run(), "the upstream link");
  ex_.run();
  return 0;
}

}  // namespace cleave::edge
