// The server node. Threads: the I/O thread runs every channel and the round driver (all
// bookkeeping lives there); one worker thread runs all compute (segments, averaging,
// evaluation) in arrival order, so a long kernel never stalls a heartbeat.
#include "cleave/server/server_node.h"

#include "server_impl.h"

namespace cleave::server {

std::string_view mode_name(training_mode m) {
  return m == training_mode::splitfed ? "splitfed" : "sequential";
}

training_mode parse_mode(const std::string& s) {
  if (s == "splitfed") return training_mode::splitfed;
  if (s == "sequential") return training_mode::sequential;
  throw core::error("unknown mode '" + s + "' (known: splitfed, sequential)");
}

server_node::server_node(server_config c) : impl_(std::make_unique<impl>(std::move(c))) {}
server_node::~server_node() = default;
round_report server_node::run() {
  return impl_->run();
}
void server_node::stop() {
  impl_->stop();
}
const std::vector<float>& server_node::global_params() const {
  return impl_->global_p_;
}
const std::vector<float>& server_node::global_buffers() const {
  return impl_->global_b_;
}

core::route server_node::impl::route_for_device(bool behind_edge) const {
  const std::string& text = behind_edge ? c_.edge_cuts : c_.cuts;
  const auto cuts = text.empty() ? default_cuts(model_, c_.u_shape, behind_edge) : core::parse_cuts(text);
  return core::make_route(c_.u_shape, behind_edge, cuts, model_.n_blocks());
}

transport::message_builder server_node::impl::plan_message(std::uint32_t device, bool resplit) const {
  const auto& d = devices_.at(device);
  transport::plan_desc p;
  p.epoch = resplit ? d.next_epoch : d.epoch;
  p.resplit = resplit;
  p.model_json = model_.json;
  p.training = {c_.opt, c_.seed};
  p.micro_batch_size = static_cast<std::uint32_t>(c_.batch / c_.micro_batches);
  p.n_micro_batches = static_cast<std::uint32_t>(c_.micro_batches);
  p.device_id = device;
  p.edge_id = d.behind_edge ? d.via->id : 0;
  p.route = resplit ? *d.next : d.route;
  return transport::make_plan(p);
}

void server_node::impl::send_global(const std::shared_ptr<peer>& to, std::uint32_t device_id, double acc, double loss) {
  transport::global_weights_desc g;
  g.round = round_;
  g.n_blocks = static_cast<std::uint32_t>(model_.n_blocks());
  g.device_id = device_id;
  g.test_accuracy = static_cast<float>(acc);
  g.test_loss = static_cast<float>(loss);
  to->out->post(transport::make_global_weights(g, global_p_, global_b_));
}

void server_node::impl::register_device(const std::shared_ptr<peer>& via, const wire::Hello& h) {
  const std::uint32_t id = h.node_id();
  const bool behind_edge = via->role == transport::node_role::edge;
  if (id == 0 || id >= 1000000) throw core::error("device id " + std::to_string(id) + " out of range");
  auto& d = devices_[id];
  if (d.connected && d.via != via)
    throw core::error("device " + std::to_string(id) + " is already connected through " + d.via->identity);
  d.via = via;
  d.behind_edge = behind_edge;
  d.route = route_for_device(behind_edge);
  d.epoch = plan_epoch_;
  d.next.reset();
  d.last_step = ~0ULL;
  d.connected = true;
  // A fresh start: whatever the worker still holds of this device goes.
  asio::post(work_, [this, id] {
    host_->drop_device(id);
    held_.forget(id);
  });
  d.participant = d.done = false;
  if (behind_edge) via->devices.insert(id);
  spdlog::info("server: device {} joined{} ({} samples): {}", id,
               behind_edge ? " through " + via->identity : std::string(), h.n_samples(), d.route.str());
  transport::welcome_info w;
  w.node_id = id;
  w.plan_epoch = plan_epoch_;
  via->out->post(transport::make_welcome(w));
  via->out->post(plan_message(id));
  send_global(via, id, last_.test_accuracy, last_.test_loss);
  if (!behind_edge) apply_caps(via);
  notify();
}

void server_node::impl::device_gone(std::uint32_t id, const std::string& reason) {
  auto it = devices_.find(id);
  if (it == devices_.end() || !it->second.connected) return;
  it->second.connected = false;
  if (it->second.via) it->second.via->devices.erase(id);
  spdlog::warn("server: device {} left{}: {}", id,
               it->second.participant && round_open_ ? " during round " + std::to_string(round_) : "", reason);
  it->second.next.reset();
  asio::post(work_, [this, id] {
    host_->discard_pending(id);
    held_.forget(id);
  });
  maybe_replan("device " + std::to_string(id) + " left");
  notify();
}

void server_node::impl::drop_peer(const std::shared_ptr<peer>& p, const std::string& reason) {
  if (!p->alive) return;
  p->alive = false;
  spdlog::warn("server: closing the channel to {}: {}", p->identity, reason);
  if (p->role == transport::node_role::device) {
    device_gone(p->id, reason);
  } else {
    for (auto id : std::set<std::uint32_t>(p->devices)) device_gone(id, "its edge " + p->identity + " left");
    edges_expected_.erase(p->id);
  }
  asio::co_spawn(
      io_, [p]() -> asio::awaitable<void> { co_await p->ch.close(); }, asio::detached);
  notify();
}

asio::awaitable<void> server_node::impl::accept_loop() {
  while (!stopping_) {
    auto r = co_await listener_->accept();
    if (!r) {
      if (!stopping_) spdlog::error("server: accept failed: {}", r.error().reason());
      co_return;
    }
    auto p = std::make_shared<peer>();
    p->ch = std::move(r.value());
    p->identity = p->ch.peer_identity();
    p->out = std::make_shared<transport::outbox>(p->ch);
    peers_.push_back(p);
    asio::co_spawn(io_, serve(p), asio::detached);
  }
}

asio::awaitable<void> server_node::impl::serve(std::shared_ptr<peer> p) {
  // The first message must be a Hello whose role matches the certificate.
  auto first = co_await p->ch.receive();
  if (!first) co_return;
  const auto* h = first->as<wire::Hello>();
  if (!h || h->protocol_version() != transport::protocol_version) {
    p->out->post(transport::make_error(wire::ErrorCode::bad_message, "expected a Hello of protocol version " +
                                                                         std::to_string(transport::protocol_version)));
    drop_peer(p, h ? "protocol version mismatch" : "first message was not a Hello");
    co_return;
  }
  p->role = static_cast<transport::node_role>(h->role());
  p->id = h->node_id();
  if (p->ch.peer_role() && *p->ch.peer_role() != p->role) {
    drop_peer(p, "Hello claims role " + std::string(transport::role_name(p->role)) + " but the certificate says " +
                     std::string(transport::role_name(*p->ch.peer_role())));
    co_return;
  }
  try {
    if (p->role == transport::node_role::device) {
      register_device(p, *h);
    } else if (p->role == transport::node_role::edge) {
      spdlog::info("server: edge {} ({}) connected", p->id, p->identity);
      apply_caps(p);
      transport::welcome_info w;
      w.node_id = p->id;
      w.plan_epoch = plan_epoch_;
      p->out->post(transport::make_welcome(w));
    } else {
      drop_peer(p, "a server cannot join another server");
      co_return;
    }
  } catch (const core::error& e) {
    p->out->post(transport::make_error(wire::ErrorCode::refused, e.what()));
    drop_peer(p, e.what());
    co_return;
  }
  for (;;) {
    auto m = co_await p->ch.receive();
    if (!m) {
      drop_peer(p, m.error().reason());
      co_return;
    }
    if (!p->alive) co_return;
    try {
      on_message(p, std::move(m.value()));
    } catch (const core::error& e) {
      p->out->post(transport::make_error(wire::ErrorCode::bad_message, e.what()));
      drop_peer(p, e.what());
      co_return;
    }
  }
}

void server_node::impl::on_message(const std::shared_ptr<peer>& p, transport::message m) {
  switch (m.type()) {
    case wire::Body::Activations:
      on_step_message(p, std::move(m), true);
      return;
    case wire::Body::Gradients:
      on_step_message(p, std::move(m), false);
      return;
    case wire::Body::ReplicaUpload:
      on_replica(p, *m.as<wire::ReplicaUpload>());
      return;
    case wire::Body::Hello:
      if (p->role != transport::node_role::edge) throw core::error("a second Hello on one channel");
      if (static_cast<transport::node_role>(m.as<wire::Hello>()->role()) != transport::node_role::device)
        throw core::error("an edge may only announce devices");
      try {
        register_device(p, *m.as<wire::Hello>());
      } catch (const core::error& e) {
        // Refuse that device only: the edge passes the error on and drops it.
        transport::leave_desc l{m.as<wire::Hello>()->node_id(), e.what()};
        p->out->post(transport::make_leave(l));
      }
      return;
    case wire::Body::Leave:
      if (p->role != transport::node_role::edge) throw core::error("Leave from a device");
      {
        const auto* l = m.as<wire::Leave>();
        if (!p->devices.count(l->node_id())) return;
        device_gone(l->node_id(), l->reason() ? l->reason()->str() : "left");
      }
      return;
    case wire::Body::Cutover:
      on_cutover(p, *m.as<wire::Cutover>());
      return;
    case wire::Body::Migrate:
      on_migrate(p, *m.as<wire::Migrate>());
      return;
    case wire::Body::Profile:
      on_profile(p, *m.as<wire::Profile>());
      return;
    case wire::Body::Pong:
    case wire::Body::Ping:
      return;
    case wire::Body::Error: {
      const auto* e = m.as<wire::Error>();
      spdlog::warn("server: {} reports: {}", p->identity, e->message() ? e->message()->str() : "error");
      return;
    }
    default:
      throw core::error("unexpected " + std::string(transport::body_name(m.type())) + " from " + p->identity);
  }
}

void server_node::impl::on_step_message(const std::shared_ptr<peer>& p, transport::message m, bool is_activation) {
  const std::uint32_t dev =
      is_activation ? m.as<wire::Activations>()->device_id() : m.as<wire::Gradients>()->device_id();
  const std::uint32_t epoch = is_activation ? m.as<wire::Activations>()->epoch() : m.as<wire::Gradients>()->epoch();
  const std::uint64_t step = is_activation ? m.as<wire::Activations>()->step() : m.as<wire::Gradients>()->step();
  const auto it = devices_.find(dev);
  if (it == devices_.end() || it->second.via != p || !it->second.connected)
    throw core::error("step message for device " + std::to_string(dev) + ", which is not attached through " +
                      p->identity);
  if (p->role == transport::node_role::device && dev != p->id)
    throw core::error("device " + std::to_string(p->id) + " sent a step message for device " + std::to_string(dev));
  auto& d = it->second;
  if (epoch != d.epoch) {
    p->out->post(transport::make_error(wire::ErrorCode::stale_epoch, "plan epoch " + std::to_string(epoch) +
                                                                         " of device " + std::to_string(dev) +
                                                                         " is over; now " + std::to_string(d.epoch)));
    return;
  }
  if (!round_open_ || !it->second.participant || it->second.done ||
      step / static_cast<std::uint64_t>(c_.local_steps) != round_) {
    spdlog::debug("server: dropping a step message of device {} outside its round", dev);
    return;
  }
  if (is_activation && step != d.last_step) {
    d.last_step = step;
    if (c_.force_route && !d.next && c_.mode == training_mode::splitfed)
      if (auto r = c_.force_route(dev, step, d.route); r && !(*r == d.route)) propose(dev, *r, "forced");
  }
  auto out = p->out;
  auto task = std::make_shared<transport::message>(std::move(m));
  asio::post(work_, [this, dev, out, p, r = d.route, epoch, task, is_activation] {
    held_.run_or_hold(*host_, dev, [this, dev, out, p, r, epoch, task, is_activation] {
      compute_step(dev, r, epoch, out, std::move(*task), is_activation, p);
    });
  });
}

void server_node::impl::compute_step(std::uint32_t dev, const core::route& r, std::uint32_t epoch,
                                     std::shared_ptr<transport::outbox> out, transport::message m, bool is_activation,
                                     std::shared_ptr<peer> p) {
  const auto t0 = clock::now();
  std::pair<int, int> observed{-1, -1};  // the segment whose step completed here
  try {
    const int seg = r.segments_on(core::tier::server).at(0);
    core::segment_output o;
    std::uint64_t step = 0;
    std::uint32_t mb = 0;
    if (is_activation) {
      const auto& a = *m.as<wire::Activations>();
      step = a.step();
      mb = a.micro_batch();
      if (a.block() != static_cast<std::uint32_t>(r.begin(seg)))
        throw core::error("activation for block " + std::to_string(a.block()) + " but the server's segment starts at " +
                          std::to_string(r.begin(seg)));
      const bool loss_here = seg + 1 == r.n_segments();
      if (loss_here != (a.labels() != nullptr))
        throw core::error(loss_here ? "activation without labels for the loss" : "labels sent in a U-shaped plan");
      const auto bi = transport::batch_of(a);
      core::tensor x = transport::to_backend(*be_, transport::view_of(*a.activation()));
      core::tensor y = a.labels() ? transport::to_backend(*be_, transport::view_of(*a.labels())) : core::tensor{};
      const float scale = static_cast<float>(x.shape()[0]) / static_cast<float>(bi.batch_size);
      o = host_->forward(dev, seg, {step, mb}, x, y, scale, bi.n_micro_batches,
                         core::hash32(static_cast<std::uint32_t>(step), mb));
    } else {
      const auto& g = *m.as<wire::Gradients>();
      step = g.step();
      mb = g.micro_batch();
      if (g.block() != static_cast<std::uint32_t>(r.end(seg)))
        throw core::error("gradient for block " + std::to_string(g.block()) + " but the server's segment ends at " +
                          std::to_string(r.end(seg)));
      o = host_->backward(dev, seg, {step, mb}, transport::to_backend(*be_, transport::view_of(*g.gradient())));
    }
    be_->synchronize();
    if (o.stepped) observed = {r.begin(seg), r.end(seg)};
    if (o.dir == core::segment_output::direction::up) {
      const transport::step_key key{epoch, step, mb, dev, static_cast<std::uint32_t>(r.end(seg))};
      const auto& a = *m.as<wire::Activations>();
      out->post(transport::make_activations(key, transport::batch_of(a), *be_, o.value, nullptr));
    } else if (o.dir == core::segment_output::direction::down) {
      const transport::step_key key{epoch, step, mb, dev, static_cast<std::uint32_t>(r.begin(seg))};
      out->post(transport::make_gradients(key, *be_, o.value, o.loss, o.n_correct));
      if (is_activation) {
        const double n = static_cast<double>(o.value.shape()[0]);
        const double loss = o.loss;
        const auto correct = o.n_correct;
        asio::post(io_, [this, n, loss, correct] {
          loss_sum_ += loss * n;
          n_loss_ += static_cast<std::uint64_t>(n);
          n_correct_ += correct;
        });
      }
    }
  } catch (const core::error& e) {
    const std::string why = e.what();
    asio::post(io_, [this, p, dev, why] {
      spdlog::warn("server: device {}: {}", dev, why);
      if (p->role == transport::node_role::device)
        drop_peer(p, why);
      else
        device_gone(dev, why);
    });
  }
  const double secs = std::chrono::duration<double>(clock::now() - t0).count();
  server_compute_.store(server_compute_.load() + secs);
  step_compute_[dev] += secs;
  if (observed.first < observed.second && live_.n_blocks() > 0) {
    // One whole step of this segment is done: the live profile learns what it costs here,
    // in micro-batches of the profiled size.
    const double per_mb = static_cast<double>(c_.batch) / c_.micro_batches;
    live_.observe(observed.first, observed.second, step_compute_[dev] * profile_batch_ / per_mb, c_.micro_batches);
    if (++n_observed_ % 8 == 0) {
      auto snap = transport::current_profile(live_, 0, profile_batch_, be_->name(), memory_budget_);
      asio::post(io_, [this, snap = std::move(snap)]() mutable {
        book_->set_profile({transport::node_role::server, 0}, std::move(snap));
      });
    }
  }
  if (observed.first >= 0) step_compute_[dev] = 0;
}

void server_node::impl::on_replica(const std::shared_ptr<peer>& p, const wire::ReplicaUpload& r) {
  if (!round_open_ || r.round() != round_) {
    spdlog::debug("server: dropping a replica of round {} from {}", r.round(), p->identity);
    return;
  }
  const auto devs = transport::devices_of(r);
  for (auto d : devs) {
    const auto it = devices_.find(d);
    if (it == devices_.end() || it->second.via != p || !it->second.participant)
      throw core::error("replica names device " + std::to_string(d) + ", which is not in this round through " +
                        p->identity);
  }
  if (p->role == transport::node_role::device && (devs.size() != 1 || devs[0] != p->id))
    throw core::error("a device may only upload its own replicas");
  const auto w = transport::replica_weights_of(r, model_);
  if (!devs.empty() && !devices_.at(devs[0]).done && r.n_samples() > 0)
    avg_->add(static_cast<int>(r.first_block()), static_cast<int>(r.end_block()), static_cast<double>(r.n_samples()),
              w.params, w.buffers);
  if (!r.final_part()) return;
  const auto s = transport::stats_of(r);
  if (p->role == transport::node_role::device) {
    device_compute_ += static_cast<double>(s.compute_us) * 1e-6;
  } else {
    edge_compute_ += static_cast<double>(s.compute_us) * 1e-6;
    device_compute_ += static_cast<double>(s.device_compute_us) * 1e-6;
    edge_bytes_ += s.bytes_moved;
    edges_done_.insert(p->id);
  }
  loss_sum_ += s.loss_sum;
  n_loss_ += s.n_loss;
  n_correct_ += s.n_correct;
  for (auto d : devs) {
    auto& st = devices_.at(d);
    st.done = true;
    st.n_samples = static_cast<std::uint64_t>(c_.local_steps) * static_cast<std::uint64_t>(c_.batch);
  }
  notify();
}

asio::awaitable<bool> server_node::impl::wait_until(const std::function<bool()>& cond, clock::time_point deadline) {
  while (!cond()) {
    if (stopping_ || clock::now() >= deadline) co_return cond();
    wake_.expires_at(std::min(deadline, clock::now() + std::chrono::milliseconds(200)));
    std::error_code ec;  // cancelled by notify(): re-check the condition
    co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  co_return true;
}

std::uint64_t server_node::impl::channel_bytes() const {
  std::uint64_t b = 0;
  for (const auto& p : peers_) {
    const auto s = p->ch.stats();
    b += s.bytes_sent + s.bytes_received;
  }
  return b;
}

asio::awaitable<void> server_node::impl::drive_rounds() {
  const auto join_deadline = clock::now() + std::chrono::milliseconds(static_cast<long>(c_.join_timeout_s * 1000));
  auto n_connected = [&] {
    int n = 0;
    for (auto& [id, d] : devices_) n += d.connected;
    return n;
  };
  spdlog::info("server: waiting for {} device{}", c_.min_devices, c_.min_devices == 1 ? "" : "s");
  // Callables passed to coroutines are named first (g++ 12 destroys temporaries in a co_await
  // expression twice).
  const std::function<bool()> enough = [&] { return n_connected() >= c_.min_devices; };
  if (!co_await wait_until(enough, join_deadline)) {
    if (!stopping_)
      shutdown("only " + std::to_string(n_connected()) + " of " + std::to_string(c_.min_devices) +
               " devices joined within " + std::to_string(static_cast<int>(c_.join_timeout_s)) + " s");
    co_return;
  }
  for (int r = 1; r <= c_.rounds && !stopping_; ++r) {
    const auto t0 = clock::now();
    round_ = static_cast<std::uint64_t>(r);
    apply_schedule(round_);
    n_resplits_ = 0;
    planner_s_ = 0;
    if (r > 1 && book_) asio::post(work_, [this] { reprofile_if_idle(); });
    maybe_replan("round " + std::to_string(r));
    avg_ = std::make_unique<core::model_average>(model_);
    loss_sum_ = device_compute_ = edge_compute_ = 0;
    n_loss_ = n_correct_ = edge_bytes_ = 0;
    server_compute_.store(0);
    edges_done_.clear();
    edges_expected_.clear();
    const std::uint64_t bytes0 = channel_bytes();
    const float lr = round_lr(round_);
    std::vector<std::uint32_t> participants;
    for (auto& [id, d] : devices_) {
      d.participant = d.connected;
      d.done = false;
      d.n_samples = 0;
      if (d.connected) {
        participants.push_back(id);
        if (d.behind_edge) edges_expected_.insert(d.via->id);
      }
    }
    // Every server replica starts the round from the global weights. The worker gets copies:
    // the I/O thread keeps changing devices_ meanwhile.
    std::vector<std::pair<std::uint32_t, core::route>> routes;
    for (auto id : participants) routes.emplace_back(id, devices_.at(id).route);
    auto install_task = [this, routes, lr, p = global_p_, b = global_b_] {
      for (const auto& [id, route] : routes) {
        for (int seg : route.segments_on(core::tier::server)) {
          if (!host_->hosts(id, route, seg)) host_->host(id, route, seg, c_.mode == training_mode::sequential);
          transport::install(host_->stage_of(id, seg), p, b);
        }
        host_->set_learning_rate(id, lr);
      }
      return 0;
    };
    co_await on_worker(install_task);
    round_open_ = true;
    if (c_.on_round_start) c_.on_round_start(round_, static_cast<int>(participants.size()));
    const auto deadline = clock::now() + std::chrono::milliseconds(static_cast<long>(c_.round_deadline_s * 1000));
    const std::function<bool()> all_done = [&] {
      for (auto id : participants) {
        const auto& d = devices_.at(id);
        if (d.connected && !d.done) return false;
      }
      for (auto e : edges_expected_)
        if (!edges_done_.count(e)) return false;
      return true;
    };
    auto start = [&](std::uint32_t id) {
      const auto& d = devices_.at(id);
      transport::round_start_desc rs;
      rs.round = round_;
      rs.epoch = plan_epoch_;
      rs.local_steps = static_cast<std::uint32_t>(c_.local_steps);
      rs.deadline_ms = static_cast<std::uint64_t>(c_.round_deadline_s * 1000);
      rs.learning_rate = lr;
      rs.device_id = id;
      rs.devices = participants;
      d.via->out->post(transport::make_round_start(rs));
    };
    if (c_.mode == training_mode::splitfed) {
      for (auto id : participants) start(id);
      co_await wait_until(all_done, deadline);
    } else {
      for (auto id : participants) {
        if (!devices_.at(id).connected) continue;
        start(id);
        const std::function<bool()> turn_over = [&] { return devices_.at(id).done || !devices_.at(id).connected; };
        co_await wait_until(turn_over, deadline);
      }
      co_await wait_until(all_done, deadline);
    }
    round_open_ = false;
    const double train_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    std::vector<std::uint32_t> included;
    for (auto id : participants)
      if (devices_.at(id).done) included.push_back(id);
    if (included.size() < participants.size())
      spdlog::warn("server: round {}: {} of {} devices finished in time; averaging those", r, included.size(),
                   participants.size());
    // Average (server replicas of the included devices + uploads), then evaluate.
    struct averaged {
      std::vector<float> params, buffers;
      core::eval_report eval;
    };
    std::set<std::uint32_t> in(included.begin(), included.end());
    // Routes may have changed during the round (re-splits).
    for (auto& [id, route] : routes) route = devices_.at(id).route;
    auto average_task = [this, routes, in, avg = avg_.get(), p = global_p_, b = global_b_]() mutable {
      std::set<std::pair<int, int>> shared_done;
      const bool shared = c_.mode == training_mode::sequential;
      for (const auto& [id, route] : routes) {
        for (int seg : route.segments_on(core::tier::server)) {
          if (!in.count(id) || route.begin(seg) == route.end(seg)) continue;
          if (shared && !shared_done.insert({route.begin(seg), route.end(seg)}).second) continue;
          core::stage& st = host_->stage_of(id, seg);
          std::vector<float> sp(static_cast<std::size_t>(st.n_params())), sb(static_cast<std::size_t>(st.n_buffers()));
          if (!sp.empty()) be_->download(st.params(), sp.data());
          if (!sb.empty()) be_->download(st.buffers(), sb.data());
          const double w =
              static_cast<double>(c_.local_steps) * c_.batch * (shared ? static_cast<double>(in.size()) : 1.0);
          avg->add(route.begin(seg), route.end(seg), w, sp, sb);
        }
        host_->discard_pending(id);
      }
      avg->mean_into(p, b);
      core::stage& es = eval_->model_stage();
      be_->upload(es.params(), p.data());
      if (!b.empty()) be_->upload(es.buffers(), b.data());
      return averaged{std::move(p), std::move(b), eval_->evaluate(data_.test)};
    };
    const auto result = co_await on_worker(average_task);
    global_p_ = result.params;
    global_b_ = result.buffers;
    const core::eval_report ev = result.eval;
    round_report rep;
    rep.round = round_;
    rep.n_devices = static_cast<int>(included.size());
    rep.n_participants = static_cast<int>(participants.size());
    rep.seconds = std::chrono::duration<double>(clock::now() - t0).count();
    rep.train_seconds = train_seconds;
    rep.train_loss = n_loss_ ? loss_sum_ / static_cast<double>(n_loss_) : 0.0;
    rep.train_accuracy = n_loss_ ? static_cast<double>(n_correct_) / static_cast<double>(n_loss_) : 0.0;
    rep.test_loss = ev.loss;
    rep.test_accuracy = ev.accuracy;
    rep.device_compute_s = device_compute_;
    rep.edge_compute_s = edge_compute_;
    rep.server_compute_s = server_compute_.load();
    rep.bytes_moved = channel_bytes() - bytes0 + edge_bytes_;
    rep.step_seconds = train_seconds / c_.local_steps;
    rep.predicted_step_seconds = predicted_step(included);
    rep.learning_rate = lr;
    rep.n_resplits = n_resplits_;
    rep.planner_seconds = planner_s_;
    for (auto id : participants)
      if (devices_.at(id).connected) rep.routes.emplace_back(id, devices_.at(id).route.str());
    last_ = rep;
    spdlog::info(
        "round {}/{}: {}/{} devices, train loss {:.4f} acc {:.4f}, test loss {:.4f} acc {:.4f}; compute device {:.1f} "
        "s, edge {:.1f} s, server {:.1f} s; {:.1f} MB moved; {:.1f} s{}",
        r, c_.rounds, rep.n_devices, rep.n_participants, rep.train_loss, rep.train_accuracy, rep.test_loss,
        rep.test_accuracy, rep.device_compute_s, rep.edge_compute_s, rep.server_compute_s, rep.bytes_moved / 1e6,
        rep.seconds, scheduled_lr() ? fmt::format("; lr {:.4g}", rep.learning_rate) : std::string());
    if (rep.predicted_step_seconds > 0)
      spdlog::info("round {}: step {:.1f} ms, predicted {:.1f} ms ({:+.0f}%), {} re-split{}", r, rep.step_seconds * 1e3,
                   rep.predicted_step_seconds * 1e3, (rep.predicted_step_seconds / rep.step_seconds - 1.0) * 100.0,
                   rep.n_resplits, rep.n_resplits == 1 ? "" : "s");
    for (const auto& [id, route] : rep.routes) spdlog::info("round {}: device {}: {}", r, id, route);
    if (c_.on_round) c_.on_round(rep);
    for (const auto& p : peers_)
      if (p->alive && (p->role == transport::node_role::edge || devices_.count(p->id)))
        send_global(p, 0, ev.accuracy, ev.loss);
    if (!c_.checkpoint.empty()) {
      core::checkpoint ck;
      ck.model_json = model_.json;
      ck.seed = c_.seed;
      ck.epoch = r;
      ck.optimizer = c_.opt.kind == core::optimizer_kind::sgd ? "sgd" : "adamw";
      const auto lay = core::layout_of(model_);
      ck.tensors.push_back({"global:params", core::shape{static_cast<std::int64_t>(global_p_.size())}, global_p_});
      ck.tensors.push_back({"global:buffers", core::shape{static_cast<std::int64_t>(global_b_.size())}, global_b_});
      core::save_checkpoint(c_.checkpoint.string(), ck);
    }
  }
  if (!stopping_)
    shutdown(fmt::format("training finished after {} rounds: test accuracy {:.4f}", c_.rounds, last_.test_accuracy));
}

void server_node::impl::shutdown(const std::string& why) {
  if (stopping_) return;
  stopping_ = true;
  stop_reason_ = why;
  spdlog::info("server: {}", why);
  if (listener_) listener_->close();
  for (const auto& p : peers_)
    if (p->alive) p->out->post(transport::make_error(wire::ErrorCode::shutting_down, why));
  notify();
  asio::co_spawn(
      io_,
      [this]() -> asio::awaitable<void> {
        for (const auto& p : peers_)
          if (p->alive) {
            p->alive = false;
            co_await p->ch.close();
          }
        io_.stop();
      },
      asio::detached);
}

round_report server_node::impl::run() {
  if (c_.rounds < 1 || c_.local_steps < 1 || c_.batch < 1 || c_.micro_batches < 1 || c_.batch % c_.micro_batches)
    throw core::error(
        "rounds, local steps, batch and micro-batches must be >= 1, and the batch a multiple of the "
        "micro-batches");
  if (c_.opt.schedule != core::schedule_kind::constant || c_.opt.warmup_steps != 0)
    throw core::error(
        "the server's learning rate follows a per-round schedule (lr_schedule, warmup_rounds), "
        "not the optimizer's per-step one");
  if (c_.warmup_rounds < 0 || c_.warmup_rounds >= c_.rounds)
    throw core::error("warm-up rounds must be >= 0 and fewer than the rounds");
  schedule_ = transport::parse_schedule(c_.schedule);  // configuration errors first
  tls_.emplace(transport::tls_files_in(c_.certs, c_.name));
  be_ = backend::make_backend(c_.backend);
  data_ = core::load_dataset(c_.data);
  model_ = core::resolve_model(c_.model, data_.train.item, data_.train.n_classes);
  data_.train = {};  // the server only evaluates
  // Validate the configured cuts now, not when the first device joins.
  route_for_device(false);
  route_for_device(true);
  core::train_config tc;
  tc.seed = c_.seed;
  tc.opt = c_.opt;
  host_ = std::make_unique<core::segment_host>(*be_, model_, c_.opt, c_.seed);
  if (c_.adaptive && c_.mode == training_mode::splitfed) {
    // The server's own blocks, profiled before anyone joins: the first plan is informed.
    const auto t0 = clock::now();
    core::profile_options po;
    po.batch = std::max(1, c_.batch / c_.micro_batches);
    po.seed = c_.seed;
    profile_batch_ = static_cast<std::uint32_t>(po.batch);
    memory_budget_ = c_.memory_budget ? c_.memory_budget : core::default_memory_budget();
    auto base = core::profile_blocks(*be_, model_, c_.opt, po);
    double total = 0;
    for (const auto& b : base) total += b.forward_seconds + b.backward_seconds;
    live_ = core::live_profile(base);
    book_ = std::make_unique<profile_book>(model_, po.batch, c_.micro_batches, c_.u_shape);
    book_->set_profile({transport::node_role::server, 0},
                       transport::current_profile(live_, 0, profile_batch_, be_->name(), memory_budget_));
    spdlog::info("server: profiled {} blocks on {} in {:.2f} s: {:.2f} ms per micro-batch of {}", model_.n_blocks(),
                 be_->name(), std::chrono::duration<double>(clock::now() - t0).count(), total * 1e3, po.batch);
  }
  eval_ = std::make_unique<core::trainer>(*be_, model_, tc);
  core::initial_values(model_, 0, model_.n_blocks(), c_.seed, global_p_, global_b_);
  transport::listener_options lo;
  lo.allowed_identities = c_.allowed;
  listener_.emplace(io_.get_executor(), *tls_, asio::ip::tcp::endpoint(asio::ip::make_address(c_.listen_host), c_.port),
                    lo);
  spdlog::info(
      "server: {} ({} blocks, {} parameters), mode {}, {}{} rounds x {} steps x batch {}, backend {} ({}); "
      "listening on {}:{}",
      model_.name, model_.n_blocks(), model_.n_params(), mode_name(c_.mode), c_.u_shape ? "U-shaped, " : "", c_.rounds,
      c_.local_steps, c_.batch, be_->name(), be_->device_name(), c_.listen_host, listener_->port());
  if (c_.on_listening) c_.on_listening(listener_->port());
  worker_ = std::thread([this] { work_.run(); });
  asio::co_spawn(io_, accept_loop(), asio::detached);
  std::exception_ptr failed;
  asio::co_spawn(io_, drive_rounds(), [&](std::exception_ptr e) {
    if (e) {
      failed = e;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        shutdown(std::string("failed: ") + x.what());
      }
    }
  });
  io_.run();
  work_guard_.reset();
  worker_.join();
  if (failed) std::rethrow_exception(failed);
  if (round_ == 0) throw core::error(stop_reason_);
  return last_;
}

}  // namespace cleave::server
