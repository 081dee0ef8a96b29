// The server node on the node runtime: sessions of devices and edges, each message handed to the
// part it is for (membership, the round, the splitter), step messages through the segment runner.
#include "cleave/server/server_node.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "cleave/backend/registry.h"
#include "cleave/protocol/signed_keys.h"
#include "server_impl.h"

namespace cleave::server {

server_node::impl::impl(server_config c)
    : c_(std::move(c)),
      ex_("server"),
      wake_(ex_.io()),
      plans_(c_, model_, members_, ex_),
      store_(c_, model_),
      wiring_(*this),
      round_(c_, model_, wiring_, ex_, wake_),
      publisher_({c_, model_, ex_, members_, plans_, round_, acceptor_}) {
  if (c_.secure_aggregation) plans_.defer_off_device_moves_while([this] { return trains(round_.phase()); });
}

server_node::server_node(server_config c) : impl_(std::make_unique<impl>(std::move(c))) {}
server_node::~server_node() = default;
round_report server_node::run() {
  return impl_->run();
}
void server_node::stop() {
  impl_->stop();
}
void server_node::stop(const std::string& why) {
  impl_->stop(why);
}
void server_node::stop_on_signals() {
  impl_->stop_on_signals();
}
const std::string& server_node::checkpoint_failure() const {
  return impl_->checkpoint_failure_;
}
const std::vector<float>& server_node::global_params() const {
  return impl_->global_.params;
}
const std::vector<float>& server_node::global_buffers() const {
  return impl_->global_.buffers;
}

void server_node::impl::send_global(const runtime::session_ptr& to, std::uint32_t device_id) {
  protocol::global_weights_desc g;
  const round_report& last = round_.last();
  g.round = last.round;  // the round these weights come from
  g.n_blocks = static_cast<std::uint32_t>(model_.n_blocks());
  g.device_id = device_id;
  // Only for weights that were evaluated (NaN: not this round).
  g.test_accuracy = last.evaluated ? static_cast<float>(last.test_accuracy) : std::nanf("");
  g.test_loss = last.evaluated ? static_cast<float>(last.test_loss) : std::nanf("");
  to->post(protocol::make_global_weights(g, global_.params, global_.buffers));
}

void server_node::impl::on_hello(const runtime::session_ptr& s, const transport::message& hello) {
  if (s->role == core::tier::device) return register_device(s, *hello.as<wire::Hello>());
  if (s->role == core::tier::admin) return desk_.admit(s);
  if (s->role != core::tier::edge) throw core::error("a server cannot join another server");
  spdlog::info("server: edge {} ({}) connected", s->id, s->identity);
  schedule_->apply(s->ch, s->identity);
  protocol::welcome_info w;
  w.node_id = s->id;
  w.plan_epoch = plans_.epoch();
  w.run_id = run_id_;
  w.per_device_replicas = c_.aggregate.per_device();
  s->post(protocol::make_welcome(w));
  runtime::send_revocations(*tls_, s);  // for the devices behind it
}

void server_node::impl::register_device(const runtime::session_ptr& via, const wire::Hello& h) {
  const std::uint32_t id = h.node_id();
  const bool behind_edge = via->role == core::tier::edge;
  const auto old = members_.join(id, via);
  const bool in_round = round_.counted_out(id, true);
  auto& d = *members_.find(id);
  // In the checkpoint resumed and not trained since: its nodes keep its segments' optimizer state
  // (the server restores its own when the device's first round opens). Any other join starts them
  // afresh on every tier.
  d.resumes = resumed_opt_.count(id) > 0 || plans_.resumes(id);
  const std::string resumed = plans_.place(id, d);
  // By its certificate: directly, or as its edge (which checked that certificate) names it.
  d.name = !behind_edge ? via->identity : h.name() ? h.name()->str() : "device-" + std::to_string(id);
  d.joined_round = d.moved_round = round_.number();
  if (old && old != via) {
    spdlog::warn("server: device {} reconnected{}; its older connection is superseded", id,
                 in_round ? " and is counted out of round " + std::to_string(round_.number()) : "");
    if (!behind_edge) acceptor_->close(old, "superseded by a newer connection");
  }
  // A fresh start: whatever the compute thread still holds of this device goes.
  ex_.post_compute([this, id, cut = plans_.cut_of(d.rs.route)] {
    runner_->discard(id, true);
    runner_->set_cut(id, cut);
  });
  spdlog::info("server: device {} joined{} ({} samples): {}{}", id,
               behind_edge ? " through " + via->identity : std::string(), h.n_samples(), d.rs.route.str(), resumed);
  protocol::welcome_info w;
  w.node_id = id;
  w.plan_epoch = plans_.epoch();
  w.run_id = run_id_;
  via->post(protocol::make_welcome(w));
  if (!behind_edge) runtime::send_revocations(*tls_, via);  // its edge passes on its own
  via->post(plans_.plan_message(id));
  send_global(via, id);
  if (!behind_edge) schedule_->apply(via->ch, via->identity);
  wake_.notify();
}

void server_node::impl::device_gone(std::uint32_t id, const std::string& reason) {
  if (!members_.leave(id)) return;
  const bool in_round = round_.counted_out(id, false);
  // Once the run is over, nodes leaving is the shutdown itself.
  spdlog::log(ex_.stopping() ? spdlog::level::debug : spdlog::level::warn, "server: device {} left{}: {}", id,
              in_round && !ex_.stopping() ? " during round " + std::to_string(round_.number()) : "", reason);
  ex_.post_compute([this, id] { runner_->discard(id); });
  replan("device " + std::to_string(id) + " left");
  wake_.notify();
}

void server_node::impl::on_closed(const runtime::session_ptr& s, const std::string& why) {
  if (s->role == core::tier::admin) return;  // an operator's request answered
  spdlog::log(ex_.stopping() ? spdlog::level::debug : spdlog::level::warn, "server: channel to {} closed: {}",
              s->identity, why);
  round_.channel_closed(s.get());
  const std::string reason = s->role == core::tier::edge ? "its edge " + s->identity + " left" : why;
  for (auto id : members_.closed(s)) device_gone(id, reason);
  members_.forget_session(s);
}

void server_node::impl::on_message(const runtime::session_ptr& s, transport::message m) {
  const bool edge = s->role == core::tier::edge;
  if (s->role == core::tier::admin) return desk_.on_message(s, m);
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
        s->post(protocol::make_leave({h.node_id(), e.what()}));
      }
      return;
    }
    case wire::Body::Leave: {
      if (!edge) throw core::error("Leave from a device");
      const auto* l = m.as<wire::Leave>();
      if (const auto* d = members_.find(l->node_id()); d && d->via == s)
        device_gone(l->node_id(), core::printable(l->reason() ? l->reason()->str() : "left"));
      return;
    }
    case wire::Body::Cutover:
      return on_cutover(s, *m.as<wire::Cutover>());
    case wire::Body::SecAgg:
      return on_secagg(s, *m.as<wire::SecAgg>());
    case wire::Body::Migrate:
      return on_migrate(s, std::move(m));
    case wire::Body::Profile: {
      const auto& p = *m.as<wire::Profile>();
      if ((!edge || p.node_id() != s->id) && members_.attached(p.node_id(), s, "profile"))
        round_.heard_from(p.node_id(), p.step());  // a device's, directly or through its edge
      return round_.planner_ran(plans_.on_profile(s, p, acceptor_->sessions()));
    }
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
  const auto key = *protocol::step_key_of(m);
  const std::uint32_t dev = key.device_id, epoch = key.epoch;
  const std::uint64_t step = key.step;
  auto* at = members_.attached(dev, s, "step message");
  if (!at) return;
  auto& d = *at;
  if (epoch != d.rs.epoch) {
    s->post(transport::make_error(wire::ErrorCode::stale_epoch, "plan epoch " + std::to_string(epoch) + " of device " +
                                                                    std::to_string(dev) + " is over; now " +
                                                                    std::to_string(d.rs.epoch)));
    return;
  }
  if (!round_.takes_step(dev, step, key.attempt, act && s->role == core::tier::device)) return;
  if (act && step != d.last_step) {
    d.last_step = step;
    if (c_.force_route && !d.rs.next && c_.mode == training_mode::splitfed)
      if (auto r = c_.force_route(dev, step, d.rs.route); r && !(*r == d.rs.route))
        plans_.propose(dev, *r, d.hops, {"forced"});
  }
  auto held = std::make_shared<transport::message>(std::move(m));
  const core::tier from = d.behind_edge ? core::tier::edge : core::tier::device;
  auto task = [this, s, dev, r = d.rs.route, epoch, from, held, round = round_.number()] {
    auto res = runner_->run(dev, r, epoch, from, *held);
    if (res.out) s->post(std::move(*res.out));
    if (res.stepped && ++n_stepped_ % 8 == 0) publish_profile();
    if (res.loss_here)
      ex_.post_io([this, round, loss = res.loss, n = res.n_samples, ok = res.n_correct] {
        round_.add_loss(round, loss, n, ok);
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

void server_node::impl::on_replica(const runtime::session_ptr& s, const wire::ReplicaUpload& r) {
  if (!round_.collects(r.round(), r.attempt())) return;
  const auto devs = protocol::devices_of(r);
  if (s->role == core::tier::device && (devs.size() != 1 || devs[0] != s->id))
    throw core::error("a device may only upload its own replicas");
  // A device that left its edge after its upload is still named in the edge's: counted out.
  for (auto d : devs) members_.attached(d, s, "replica");
  std::string who = "device " + std::to_string(s->id);
  if (s->role == core::tier::edge) {
    who = "edge " + s->identity + " (for devices";
    for (std::size_t i = 0; i < devs.size(); ++i) who += (i ? ", " : " ") + std::to_string(devs[i]);
    who += ")";
  }
  round_.on_upload(s.get(), s->role, who, devs, r, protocol::replica_weights_of(r, model_));
}

void server_node::impl::on_secagg(const runtime::session_ptr& s, const wire::SecAgg& m) {
  const std::uint32_t dev = m.device_id();
  if (!members_.attached(dev, s, "secure aggregation message")) return;
  if (!c_.secure_aggregation) throw core::error("a secure aggregation message, but this server does not use it");
  try {
    // Keys that any member would refuse are refused here: the others' round goes on without them.
    if (m.phase() == wire::SecAggPhase::keys) protocol::check_sender_keys(*tls_, m, dev);
    round_.on_secagg(dev, m);
  } catch (const core::error& e) {
    ex_.metrics().add("cleave_refusals_total", {{"reason", "secagg"}});
    device_failed(s, dev,
                  std::string("secure aggregation of round ") + std::to_string(round_.number()) + ": " + e.what());
  }
}

void server_node::impl::on_cutover(const runtime::session_ptr& s, const wire::Cutover& c) {
  const std::uint32_t dev = c.device_id();
  auto* at = members_.attached(dev, s, "Cutover");
  if (!at) return;
  auto& d = *at;
  const bool collecting = round_.phase() == round_phase::collecting;
  const bool leg = collecting && c.step() / static_cast<std::uint64_t>(c_.local_steps) == round_.number();
  const split::route from = plans_.cut_over(d, c.epoch(), c.step(), round_.number(), leg), to = d.rs.route;
  round_.heard_from(dev, c.step(), collecting);
  const protocol::migrate_desc md{d.rs.epoch, c.step(), dev, d.behind_edge ? s->id : 0, core::tier::server, 0};
  ex_.post_compute(ex_.guarded(
      [this, s, dev, from, to, md, cut = plans_.cut_of(to, &d.hops)] {
        runner_->set_cut(dev, cut);
        auto moved = runner_->rehost(dev, from, to, md);
        runtime::count_migration(ex_.metrics(), moved);
        for (auto& [tier, msg] : moved) s->post(std::move(msg));
      },
      [this, s, dev](const std::string& why) { device_failed(s, dev, why); }));
}

void server_node::impl::on_migrate(const runtime::session_ptr& s, transport::message m) {
  const std::uint32_t dev = m.as<wire::Migrate>()->device_id();
  if (!members_.attached(dev, s, "Migrate")) return;
  if (protocol::tier_of(m.as<wire::Migrate>()->to_role()) != core::tier::server)
    throw core::error("Migrate not addressed to the server");
  auto held = std::make_shared<transport::message>(std::move(m));
  ex_.post_compute(ex_.guarded([this, dev, held] { runner_->install(dev, *held->as<wire::Migrate>()); },
                               [this, s, dev](const std::string& why) { device_failed(s, dev, why); }));
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
  if (!c_.checkpoint.empty()) store_.check_path();
  if (c_.secure_aggregation &&
      (c_.aggregate.kind != split::aggregate_kind::mean || c_.mode != training_mode::splitfed || c_.min_devices < 2 ||
       c_.secagg_min_holders < 2 || c_.secagg_min_holders > c_.min_devices))
    throw core::error(
        "secure aggregation gives the server only sums of device replicas, each over at least --secagg-min-holders "
        "devices: it needs --aggregate mean, --mode splitfed, --min-devices >= 2 and --secagg-min-holders between 2 "
        "and --min-devices (here " +
        std::to_string(c_.secagg_min_holders) + " and " + std::to_string(c_.min_devices) + ")");
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

void server_node::impl::resume_or_start() {
  auto r = store_.load();
  if (!r) {
    std::random_device rd;
    run_id_ = (std::uint64_t{rd()} << 32 | rd()) | 1;  // never 0 ("no run")
  } else {
    try {
      core::restore(eval_->model_stage(), eval_->opt(), r->ck);
      plans_.resume(r->ck, r->plan_epoch);
    } catch (const std::exception& e) {  // a field missing or unreadable
      throw core::error("cannot resume from '" + r->from + "': its round state is incomplete (" + e.what() + ")");
    }
    run_id_ = r->run_id;
    resumed_opt_ = std::move(r->opt);
    const core::stage& st = eval_->model_stage();
    global_.params.resize(static_cast<std::size_t>(st.n_params()));
    global_.buffers.resize(static_cast<std::size_t>(st.n_buffers()));
    if (!global_.params.empty()) be_->download(st.params(), global_.params.data());
    if (!global_.buffers.empty()) be_->download(st.buffers(), global_.buffers.data());
    first_round_ = static_cast<std::uint64_t>(r->ck.epoch) + 1;
    round_report last;
    last.round = static_cast<std::uint64_t>(r->ck.epoch);
    last.evaluated = true;
    last.test_accuracy = r->test_accuracy;
    last.test_loss = r->test_loss;
    round_.restore_last(last);
    spdlog::info("server: resuming from {} after round {} of {} (test accuracy {:.4f}, plan {}){}", r->from,
                 r->ck.epoch, c_.rounds, last.test_accuracy, plans_.epoch(), plans_.resumed_text());
  }
  plans_.set_run(run_id_);
  publisher_.set_run(run_id_);
}

asio::awaitable<bool> server_node::impl::wait_for_members() {
  const auto enough = [this] { return members_.n_connected() >= c_.min_devices; };
  if (enough()) co_return true;
  round_.set_phase(round_phase::waiting);
  const auto patience = std::chrono::milliseconds(static_cast<long>(c_.join_timeout_s * 1000));
  spdlog::info("server: waiting for {} device{} ({} connected)", c_.min_devices, c_.min_devices == 1 ? "" : "s",
               members_.n_connected());
  for (auto deadline = clock::now() + patience; !ex_.stopping(); deadline += patience) {
    if (co_await wake_.wait_until(enough, deadline)) co_return true;
    if (ex_.stopping()) break;
    const std::string what = fmt::format("{} of {} devices connected after {:.0f} s", members_.n_connected(),
                                         c_.min_devices, c_.join_timeout_s);
    if (c_.exit_on_join_timeout) {
      ex_.fail(std::make_exception_ptr(core::error("only " + what)), "waiting for devices");
      break;
    }
    spdlog::warn("server: {}; still waiting", what);
  }
  co_return false;
}

asio::awaitable<void> server_node::impl::drive_rounds() {
  // The last evaluation reached --stop-at-accuracy (a resumed run's included) before the last round.
  const auto reached = [this] {
    const auto& last = round_.last();
    return c_.stop_at_accuracy > 0 && last.round > 0 && last.evaluated && last.test_accuracy >= c_.stop_at_accuracy &&
           last.round < static_cast<std::uint64_t>(c_.rounds);
  };
  for (std::uint64_t next = first_round_;
       !reached() && next <= static_cast<std::uint64_t>(c_.rounds) && !ex_.stopping();) {
    if (!co_await wait_for_members()) co_return;
    if (co_await round_.run(next, round_lr(next), global_)) ++next;
  }
  if (ex_.stopping()) co_return;
  const auto& last = round_.last();
  if (reached())
    ex_.stop(fmt::format("training finished after {} of {} rounds: test accuracy {:.4f} reached {:.4f}", last.round,
                         c_.rounds, last.test_accuracy, c_.stop_at_accuracy));
  else
    ex_.stop(fmt::format("training finished after {} rounds: test accuracy {:.4f}", c_.rounds, last.test_accuracy));
}

void server_node::impl::listen() {
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
    round_.set_phase(round_phase::idle);
    wake_.notify();
    for (const auto& s : acceptor_->sessions()) s->post(transport::make_error(wire::ErrorCode::shutting_down, why));
    co_await acceptor_->shutdown();
  });
}

round_report server_node::impl::run() {
  check_config();
  schedule_.emplace(c_.schedule, c_.name, ex_.who());  // configuration errors first
  tls_.emplace(transport::tls_files_in(c_.certs, c_.name));
  be_ = backend::make_backend(c_.backend);
  load_model();
  // Validate the configured cuts now, not when the first device joins.
  plans_.route_for_device(false);
  plans_.route_for_device(true);
  runner_.emplace(*be_, core::tier::server, 0, schedule_->start_slowdown(1.0));
  const protocol::training_settings training{c_.opt, c_.seed};
  runner_->set_model(model_.json, training);
  memory_budget_ = c_.memory_budget ? c_.memory_budget : split::default_memory_budget();
  if (c_.adaptive && c_.mode == training_mode::splitfed) {
    // The server's own blocks, profiled before anyone joins: the first plan is informed.
    runner_->profile(static_cast<std::uint32_t>(std::max(1, c_.batch / c_.micro_batches)), training, memory_budget_);
    plans_.start(runner_->snapshot(memory_budget_));
  } else if (c_.adaptive) {
    spdlog::info("server: sequential mode keeps the configured cuts (the adaptive splitter plans SplitFed rounds)");
  }
  core::train_config tc;
  tc.seed = c_.seed;
  tc.opt = c_.opt;
  eval_ = std::make_unique<core::trainer>(*be_, model_, tc);
  core::initial_values(model_, 0, model_.n_blocks(), c_.seed, global_.params, global_.buffers);
  resume_or_start();
  publisher_.open(be_->name(), test_->size());
  listen();
  ex_.spawn(drive_rounds(), "the rounds");
  ex_.run();  // a stop before any round (a signal while waiting for devices) is a clean end too
  return round_.last();
}

}  // namespace cleave::server
