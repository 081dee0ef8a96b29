// The server node on the node runtime: sessions of devices and edges, membership by connection,
// step messages through the segment runner, and the round state machine.
#include "cleave/server/server_node.h"

#include <algorithm>

#include "server_impl.h"

namespace cleave::server {

std::string_view mode_name(training_mode m) {
  return m == training_mode::splitfed ? "splitfed" : "sequential";
}

server_node::server_node(server_config c) : impl_(std::make_unique<impl>(std::move(c))) {}
server_node::~server_node() = default;
round_report server_node::run() {
  return impl_->run();
}
void server_node::stop() {
  impl_->stop();
}
void server_node::stop_on_signals() {
  impl_->stop_on_signals();
}
const std::string& server_node::checkpoint_failure() const {
  return impl_->checkpoint_failure_;
}
const std::vector<float>& server_node::global_params() const {
  return impl_->global_p_;
}
const std::vector<float>& server_node::global_buffers() const {
  return impl_->global_b_;
}

split::route server_node::impl::route_for_device(bool behind_edge) const {
  const std::string& cuts = behind_edge ? c_.edge_cuts : c_.cuts;
  split::route r = split::configured_route(model_, c_.u_shape, behind_edge, cuts);
  if (r.end(0) >= c_.min_device_blocks) return r;
  if (!cuts.empty())
    throw core::error(std::string(behind_edge ? "--edge-cuts" : "--cuts") + " '" + cuts + "' keep " +
                      std::to_string(r.end(0)) + " blocks on the device, fewer than --min-device-blocks " +
                      std::to_string(c_.min_device_blocks));
  for (auto& c : r.cuts) c = std::max(c, c_.min_device_blocks);  // the default cuts, deepened
  return split::make_route(c_.u_shape, behind_edge, r.cuts, model_.n_blocks());
}

transport::message_builder server_node::impl::plan_message(std::uint32_t device, bool resplit) const {
  const auto& d = devices_.at(device);
  transport::plan_desc p;
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
  return transport::make_plan(p);
}

transport::cut_settings server_node::impl::cut_of(const split::route& r,
                                                  const std::vector<core::hop_codecs>* hops) const {
  transport::cut_settings c;
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

void server_node::impl::send_global(const runtime::session_ptr& to, std::uint32_t device_id) {
  transport::global_weights_desc g;
  g.round = last_.round;  // the round these weights come from
  g.n_blocks = static_cast<std::uint32_t>(model_.n_blocks());
  g.device_id = device_id;
  // Only for weights that were evaluated (NaN: not this round).
  g.test_accuracy = last_.evaluated ? static_cast<float>(last_.test_accuracy) : std::nanf("");
  g.test_loss = last_.evaluated ? static_cast<float>(last_.test_loss) : std::nanf("");
  to->post(transport::make_global_weights(g, global_p_, global_b_));
}

int server_node::impl::n_connected() const {
  int n = 0;
  for (const auto& [id, d] : devices_) n += d.connected;
  return n;
}

void server_node::impl::on_hello(const runtime::session_ptr& s, const transport::message& hello) {
  if (s->role == core::tier::device) return register_device(s, *hello.as<wire::Hello>());
  if (s->role != core::tier::edge) throw core::error("a server cannot join another server");
  spdlog::info("server: edge {} ({}) connected", s->id, s->identity);
  schedule_->apply(*s);
  transport::welcome_info w;
  w.node_id = s->id;
  w.plan_epoch = plan_epoch_;
  w.run_id = run_id_;
  w.per_device_replicas = c_.aggregate.per_device();
  s->post(transport::make_welcome(w));
}

void server_node::impl::register_device(const runtime::session_ptr& via, const wire::Hello& h) {
  const std::uint32_t id = h.node_id();
  const bool behind_edge = via->role == core::tier::edge;
  if (id == 0 || id >= 1000000) throw core::error("device id " + std::to_string(id) + " out of range");
  auto& d = devices_[id];
  const auto old = d.connected ? d.via : nullptr;
  // The same identity on a newer channel supersedes the older one (half-open, or reconnected
  // before the old one timed out); closing the older one then changes nothing.
  if (old && old != via && old->identity != via->identity)
    throw core::error("device " + std::to_string(id) + " is already connected through " + old->identity);
  const bool in_round = round_.members.erase(id) > 0;
  round_.done.erase(id);
  round_.uploaded.forget(id);
  d = device_state{};
  d.via = via;
  d.behind_edge = behind_edge;
  d.connected = true;
  d.rs.reset(route_for_device(behind_edge), plan_epoch_);
  // In the checkpoint resumed and not trained since: its nodes keep its segments' optimizer state
  // (the server restores its own when the device's first round opens). Any other join starts them
  // afresh on every tier.
  d.resumes = resumed_opt_.count(id) > 0 || resumed_routes_.count(id) > 0;
  std::string resumed;
  if (const auto it = resumed_routes_.find(id); it != resumed_routes_.end()) {
    if (it->second.route.has_edge() == behind_edge) {
      // Its route before the restart, under the same plan epoch and run: its segments and theirs
      // on the way keep their state.
      d.rs.reset(it->second.route, it->second.epoch);
      resumed = fmt::format(", its route at the checkpoint (plan {})", it->second.epoch);
    } else {
      spdlog::warn(
          "server: device {} rejoined {}; its route at the checkpoint ({}) is not for that, the configured "
          "cuts apply",
          id, behind_edge ? "behind an edge" : "directly", it->second.route.str());
      resumed_routes_.erase(it);
    }
  }
  d.name = h.name() ? h.name()->str() : "device-" + std::to_string(id);
  d.joined_round = d.moved_round = round_.number;
  if (old && old != via) {
    spdlog::warn("server: device {} reconnected{}; its older connection is superseded", id,
                 in_round ? " and is counted out of round " + std::to_string(round_.number) : "");
    if (!behind_edge) acceptor_->close(old, "superseded by a newer connection");
  }
  // A fresh start: whatever the compute thread still holds of this device goes.
  ex_.post_compute([this, id, cut = cut_of(d.rs.route)] {
    runner_->discard(id, true);
    runner_->set_cut(id, cut);
  });
  spdlog::info("server: device {} joined{} ({} samples): {}{}", id,
               behind_edge ? " through " + via->identity : std::string(), h.n_samples(), d.rs.route.str(), resumed);
  transport::welcome_info w;
  w.node_id = id;
  w.plan_epoch = plan_epoch_;
  w.run_id = run_id_;
  via->post(transport::make_welcome(w));
  via->post(plan_message(id));
  send_global(via, id);
  if (!behind_edge) schedule_->apply(*via);
  wake_.notify();
}

void server_node::impl::device_gone(std::uint32_t id, const std::string& reason) {
  auto it = devices_.find(id);
  if (it == devices_.end() || !it->second.connected) return;
  it->second.connected = false;
  it->second.rs.next.reset();
  if (it->second.behind_edge) left_via_[it->second.via].insert(id);
  const bool in_round = round_.members.erase(id) > 0;
  // Once the run is over, nodes leaving is the shutdown itself.
  spdlog::log(ex_.stopping() ? spdlog::level::debug : spdlog::level::warn, "server: device {} left{}: {}", id,
              in_round && !ex_.stopping() ? " during round " + std::to_string(round_.number) : "", reason);
  ex_.post_compute([this, id] { runner_->discard(id); });
  maybe_replan("device " + std::to_string(id) + " left");
  wake_.notify();
}

void server_node::impl::on_closed(const runtime::session_ptr& s, const std::string& why) {
  spdlog::log(ex_.stopping() ? spdlog::level::debug : spdlog::level::warn, "server: channel to {} closed: {}",
              s->identity, why);
  round_.held.erase(s);
  // Only the devices attached through this very session: a superseded one changes nothing.
  std::vector<std::uint32_t> gone;
  for (const auto& [id, d] : devices_)
    if (d.connected && d.via == s) gone.push_back(id);
  const std::string reason = s->role == core::tier::edge ? "its edge " + s->identity + " left" : why;
  for (auto id : gone) device_gone(id, reason);
  left_via_.erase(s);
}

server_node::impl::device_state* server_node::impl::attached(std::uint32_t dev, const runtime::session_ptr& s,
                                                             const char* what) {
  const auto it = devices_.find(dev);
  // A device that left through this edge is still named in what the edge sent before it knew,
  // whether or not it has joined again elsewhere since: late, not a lie; dropped.
  const bool here = it != devices_.end() && it->second.via == s && it->second.connected;
  if (!here && s->role == core::tier::edge)
    if (const auto l = left_via_.find(s); l != left_via_.end() && l->second.count(dev)) return nullptr;
  if (it == devices_.end() || it->second.via != s || !it->second.connected)
    throw core::error(std::string(what) + " for device " + std::to_string(dev) + ", which is not attached through " +
                      s->identity);
  if (s->role == core::tier::device && dev != s->id)
    throw core::error("device " + std::to_string(s->id) + " sent a " + what + " for device " + std::to_string(dev));
  return &it->second;
}

void server_node::impl::on_message(const runtime::session_ptr& s, transport::message m) {
  const bool edge = s->role == core::tier::edge;
  switch (m.type()) {
    case wire::Body::Activations:
    case wire::Body::Gradients:
      return on_step(s, std::move(m));
    case wire::Body::ReplicaUpload:
      return on_replica(s, *m.as<wire::ReplicaUpload>());
    case wire::Body::Hello: {
      const auto& h = *m.as<wire::Hello>();
      if (!edge) throw core::error("a second Hello on one channel");
      if (static_cast<core::tier>(h.role()) != core::tier::device)
        throw core::error("an edge may only announce devices");
      try {
        register_device(s, h);
      } catch (const core::error& e) {  // refuse that device only: the edge passes it on
        s->post(transport::make_leave({h.node_id(), e.what()}));
      }
      return;
    }
    case wire::Body::Leave: {
      if (!edge) throw core::error("Leave from a device");
      const auto* l = m.as<wire::Leave>();
      const auto it = devices_.find(l->node_id());
      if (it != devices_.end() && it->second.via == s)
        device_gone(l->node_id(), core::printable(l->reason() ? l->reason()->str() : "left"));
      return;
    }
    case wire::Body::Cutover:
      return on_cutover(s, *m.as<wire::Cutover>());
    case wire::Body::SecAgg:
      return on_secagg(s, *m.as<wire::SecAgg>());
    case wire::Body::Migrate:
      return on_migrate(s, std::move(m));
    case wire::Body::Profile:
      return on_profile(s, *m.as<wire::Profile>());
    case wire::Body::Error:
      spdlog::warn("server: {} reports: {}", s->identity,
                   core::printable(m.as<wire::Error>()->message() ? m.as<wire::Error>()->message()->str() : "error"));
      return;
    default:
      throw core::error("unexpected " + std::string(transport::body_name(m.type())) + " from " + s->identity);
  }
}

void server_node::impl::on_step(const runtime::session_ptr& s, transport::message m) {
  const bool act = m.type() == wire::Body::Activations;
  const auto key = *transport::step_key_of(m);
  const std::uint32_t dev = key.device_id, epoch = key.epoch;
  const std::uint64_t step = key.step;
  auto* at = attached(dev, s, "step message");
  if (!at) return;
  auto& d = *at;
  if (epoch != d.rs.epoch) {
    s->post(transport::make_error(wire::ErrorCode::stale_epoch, "plan epoch " + std::to_string(epoch) + " of device " +
                                                                    std::to_string(dev) + " is over; now " +
                                                                    std::to_string(d.rs.epoch)));
    return;
  }
  if (round_.at != phase::collecting || !round_.members.count(dev) || round_.done.count(dev) ||
      step / static_cast<std::uint64_t>(c_.local_steps) != round_.number || key.attempt != round_.attempt)
    return;  // outside its round: of a round closed, an attempt at it that is over, a device counted out
  if (act && step != d.last_step) {
    d.last_step = step;
    if (c_.force_route && !d.rs.next && c_.mode == training_mode::splitfed)
      if (auto r = c_.force_route(dev, step, d.rs.route); r && !(*r == d.rs.route)) propose(dev, *r, d.hops, "forced");
  }
  auto held = std::make_shared<transport::message>(std::move(m));
  const core::tier from = d.behind_edge ? core::tier::edge : core::tier::device;
  auto task = [this, s, dev, r = d.rs.route, epoch, from, held, round = round_.number] {
    auto res = runner_->run(dev, r, epoch, from, *held);
    if (res.out) s->post(std::move(*res.out));
    if (res.stepped && ++n_stepped_ % 8 == 0) publish_profile();
    ex_.post_io([this, round, res = std::pair{res.loss_here, res.loss}, n = res.n_samples, ok = res.n_correct] {
      if (round != round_.number || !res.first) return;
      round_.loss_sum += res.second * static_cast<double>(n);
      round_.n_loss += static_cast<std::uint64_t>(n);
      round_.n_correct += ok;
    });
  };
  auto guarded = ex_.guarded(std::move(task), [this, s, dev](const std::string& why) { device_failed(s, dev, why); });
  ex_.post_compute([this, dev, task = std::move(guarded)] { runner_->submit(dev, task); });
}

void server_node::impl::device_failed(const runtime::session_ptr& s, std::uint32_t dev, const std::string& why) {
  spdlog::warn("server: device {}: {}", dev, why);
  if (s->role == core::tier::device)
    acceptor_->close(s, why);
  else
    device_gone(dev, why);
}

void server_node::impl::check_replica(const runtime::session_ptr& s, const std::vector<std::uint32_t>& devs,
                                      const wire::ReplicaUpload& r, const transport::weights_view& w) {
  const bool from_edge = s->role == core::tier::edge;
  const auto per_device = static_cast<std::uint64_t>(c_.local_steps) * static_cast<std::uint64_t>(c_.batch);
  // The routes in force now: a device that cut over to a new plan during the round told this
  // channel so (Cutover) before its upload.
  split::replica_rights rights;
  if (from_edge)
    for (auto d : devs) split::add_relayed(rights, devices_.at(d).rs.route, per_device);
  else
    rights = split::device_rights(devices_.at(s->id).rs.route, per_device);
  try {
    if (from_edge && devs.size() > 1 && c_.aggregate.per_device())
      throw core::error("a pre-average of " + std::to_string(devs.size()) + " devices, but aggregating by " +
                        split::aggregate_name(c_.aggregate) + " needs each device's own replicas");
    round_.uploaded.check(
        devs, rights,
        {static_cast<int>(r.first_block()), static_cast<int>(r.end_block()), r.n_samples(), w.params, w.buffers});
  } catch (const core::error& e) {
    round_.held.erase(s);
    std::string who = "device " + std::to_string(s->id);
    if (from_edge) {
      who = "edge " + s->identity + " (for devices";
      for (std::size_t i = 0; i < devs.size(); ++i) who += (i ? ", " : " ") + std::to_string(devs[i]);
      who += ")";
    }
    round_.refused = who + ": " + e.what();
    ex_.metrics().add("cleave_refusals_total", {{"reason", "upload"}});
    throw core::error(who + ": replica of round " + std::to_string(round_.number) + " refused: " + e.what());
  }
}

void server_node::impl::on_replica(const runtime::session_ptr& s, const wire::ReplicaUpload& r) {
  // Of a round closed, or of an attempt at this one that nobody finished in time.
  if (round_.at != phase::collecting || r.round() != round_.number || r.attempt() != round_.attempt) return;
  const auto devs = transport::devices_of(r);
  if (s->role == core::tier::device && (devs.size() != 1 || devs[0] != s->id))
    throw core::error("a device may only upload its own replicas");
  // A device that left its edge after its upload is still named in the edge's: counted out.
  for (auto d : devs) attached(d, s, "replica");
  const auto w = transport::replica_weights_of(r, model_);
  // Parts for devices no longer in the round (counted out meanwhile) are neither checked nor
  // averaged. The others are held until the upload's final part: one bad part refuses it all.
  const auto counted = [this](std::uint32_t d) { return round_.members.count(d) > 0; };
  if (std::any_of(devs.begin(), devs.end(), counted)) {
    // Under secure aggregation a device's own upload is its statistics only (its blocks come
    // masked), and an edge's carries only the edge's blocks.
    if (c_.secure_aggregation) check_secure_part(s, devs, r);
    if (!c_.secure_aggregation || s->role == core::tier::edge) check_replica(s, devs, r, w);
    round_.held[s].push_back({devs,
                              static_cast<int>(r.first_block()),
                              static_cast<int>(r.end_block()),
                              static_cast<double>(r.n_samples()),
                              {w.params.begin(), w.params.end()},
                              {w.buffers.begin(), w.buffers.end()}});
  }
  if (!r.final_part()) return;
  const auto in_now = [this](std::uint32_t d) { return round_.members.count(d) && !round_.done.count(d); };
  if (const auto it = round_.held.find(s); it != round_.held.end()) {
    for (const auto& p : it->second)
      if (p.first < p.end && p.weight > 0 && std::any_of(p.devices.begin(), p.devices.end(), in_now))
        round_.avg->add(p.first, p.end, p.weight, p.params, p.buffers);
    round_.held.erase(it);
  }
  std::vector<std::uint32_t> in;
  for (auto d : devs)
    if (in_now(d)) in.push_back(d);
  const auto st = transport::stats_of(r);
  (s->role == core::tier::device ? round_.device_compute : round_.edge_compute) += st.compute_us * 1e-6;
  round_.device_compute += st.device_compute_us * 1e-6;
  round_.edge_bytes += st.bytes_moved;
  // The loss is counted where it was computed: by the server itself, or in these statistics.
  round_.loss_sum += st.loss_sum;
  round_.n_loss += st.n_loss;
  round_.n_correct += st.n_correct;
  for (auto d : in) round_.done.insert(d);
  wake_.notify();
}

void server_node::impl::check_config() const {
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
  if (c_.keep_checkpoints < 0 || c_.keep_checkpoints > 1000)
    throw core::error("keep-checkpoints must be between 0 and 1000");
  if (c_.eval_every < 1 || c_.eval_samples < 0)
    throw core::error("eval-every must be >= 1 and eval-samples >= 0 (0: the whole test split)");
  if (!(c_.stop_at_accuracy >= 0 && c_.stop_at_accuracy <= 1))
    throw core::error("stop-at-accuracy must be between 0 (off) and 1, not " + std::to_string(c_.stop_at_accuracy));
  if (!c_.checkpoint.empty()) check_checkpoint_path();
  if (c_.secure_aggregation &&
      (c_.aggregate.kind != split::aggregate_kind::mean || c_.mode != training_mode::splitfed || c_.min_devices < 2))
    throw core::error(
        "secure aggregation gives the server only the sum of the device replicas: it needs --aggregate mean, "
        "--mode splitfed and --min-devices >= 2");
  try {
    split::check_rule(c_.aggregate);
  } catch (const core::error& e) {
    throw core::error(std::string("aggregate: ") + e.what());
  }
}

// The test data (an app's own source, or the test split of the data files) and the model.
void server_node::impl::load_model() {
  core::shape item;
  int n_classes = 0;
  if (c_.test_source) {  // an app's own test samples
    core::check_source(*c_.test_source);
    test_ = c_.test_source;
    item = test_->sample_shape();
    n_classes = test_->class_count();
  } else {
    // The server only evaluates: of the training split it reads the statistics, keeps no sample.
    core::load_options lo;
    lo.pick_train = [](const std::vector<std::int32_t>&, int) { return std::vector<std::int64_t>{}; };
    auto data = core::load_dataset(c_.data, lo);
    item = data.train.item;
    n_classes = data.train.n_classes;
    test_ = std::make_shared<core::dataset>(std::move(data.test));
  }
  model_ = c_.model_spec ? *c_.model_spec : core::resolve_model(c_.model, item, n_classes);
  if (c_.model_spec && (!(model_.input == item) || model_.n_classes != n_classes))
    throw core::error("model '" + model_.name + "' takes " + model_.input.str() + " inputs and " +
                      std::to_string(model_.n_classes) + " classes; the test data has " + item.str() + " and " +
                      std::to_string(n_classes));
  if (c_.label_groups != 1) model_ = core::with_label_groups(model_, c_.label_groups);
  if (c_.eval_samples > 0 && c_.eval_samples < test_->size()) {
    auto order = core::epoch_order(test_->size(), c_.seed, 0);
    order.resize(static_cast<std::size_t>(c_.eval_samples));
    eval_subset_ = core::subset_of(test_, std::move(order));
  }
  if (const int most = c_.u_shape ? model_.n_blocks() - 1 : model_.n_blocks();
      c_.min_device_blocks < 0 || c_.min_device_blocks > most)
    throw core::error("--min-device-blocks " + std::to_string(c_.min_device_blocks) + ": model '" + model_.name +
                      "' has " + std::to_string(model_.n_blocks()) + " blocks; a device can keep 0 to " +
                      std::to_string(most) + (c_.u_shape ? " at the bottom in U-shape" : ""));
}

round_report server_node::impl::run() {
  check_config();
  schedule_.emplace(ex_, c_.schedule, c_.name);  // configuration errors first
  tls_.emplace(transport::tls_files_in(c_.certs, c_.name));
  be_ = backend::make_backend(c_.backend);
  load_model();
  // Validate the configured cuts now, not when the first device joins.
  route_for_device(false);
  route_for_device(true);
  runner_.emplace(*be_, core::tier::server, 0, schedule_->start_slowdown(1.0));
  const transport::training_settings training{c_.opt, c_.seed};
  runner_->set_model(model_.json, training);
  memory_budget_ = c_.memory_budget ? c_.memory_budget : split::default_memory_budget();
  if (c_.adaptive && c_.mode == training_mode::splitfed) {
    // The server's own blocks, profiled before anyone joins: the first plan is informed.
    runner_->profile(static_cast<std::uint32_t>(std::max(1, c_.batch / c_.micro_batches)), training);
    book_ = std::make_unique<split::profile_book>(model_, std::max(1, c_.batch / c_.micro_batches), c_.micro_batches,
                                                  c_.u_shape);
    book_->set_profile({core::tier::server, 0}, runner_->snapshot(memory_budget_));
    measure_codecs();
  } else if (c_.adaptive) {
    spdlog::info("server: sequential mode keeps the configured cuts (the adaptive splitter plans SplitFed rounds)");
  }
  core::train_config tc;
  tc.seed = c_.seed;
  tc.opt = c_.opt;
  eval_ = std::make_unique<core::trainer>(*be_, model_, tc);
  core::initial_values(model_, 0, model_.n_blocks(), c_.seed, global_p_, global_b_);
  resume_or_start();
  open_observers();
  acceptor_.emplace(ex_, *tls_, c_.listen_host, c_.port, c_.allowed, c_.links,
                    runtime::acceptor::handlers{
                        [this](const runtime::session_ptr& s, const transport::message& h) { on_hello(s, h); },
                        [this](const runtime::session_ptr& s, transport::message m) { on_message(s, std::move(m)); },
                        [this](const runtime::session_ptr& s, const std::string& why) { on_closed(s, why); }});
  spdlog::info(
      "server: {} ({} blocks, {} parameters), mode {}, {}{} rounds x {} steps x batch {}, aggregate {}, backend {} "
      "({}); listening on {}:{}",
      model_.name, model_.n_blocks(), model_.n_params(), mode_name(c_.mode), c_.u_shape ? "U-shaped, " : "", c_.rounds,
      c_.local_steps, c_.batch, split::aggregate_name(c_.aggregate), be_->name(), be_->device_name(), c_.listen_host,
      acceptor_->port());
  if (c_.on_listening) c_.on_listening(acceptor_->port());
  ex_.on_reload([this] { runtime::reload_credentials(ex_, *tls_, &*acceptor_, nullptr); });
  ex_.on_shutdown([this](std::string why) -> asio::awaitable<void> {
    spdlog::info("server: {}", why);
    round_.at = phase::idle;
    wake_.notify();
    for (const auto& s : acceptor_->sessions()) s->post(transport::make_error(wire::ErrorCode::shutting_down, why));
    co_await acceptor_->shutdown();
  });
  ex_.spawn(drive_rounds(), "the rounds");
  ex_.run();
  if (last_.round == 0) throw core::error(ex_.stop_reason());
  return last_;
}

}  // namespace cleave::server
