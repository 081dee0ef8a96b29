// The device agent on the node runtime: the I/O thread keeps the link; the compute thread owns
// the plan and the round, draws batches and runs the device's segments through the segment
// runner, so a step follows the last one without a thread hop.
#include <algorithm>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <cmath>

#include "agent_impl.h"
#include "cleave/backend/registry.h"
#include "cleave/core/partition.h"
#include "cleave/core/random.h"
#include "cleave/protocol/signed_keys.h"
#include "cleave/runtime/node_metrics.h"
#include "policy.h"

namespace cleave::device {

using clock = std::chrono::steady_clock;

std::uint64_t default_order_seed(std::uint64_t partition_seed, std::uint32_t id) {
  return core::mix64(partition_seed ^ (0xde71ce00ULL + id));
}

namespace {

std::vector<core::tier> upstream_roles(const agent_config& c) {
  if (c.upstream_role) return {*c.upstream_role};
  if (c.upstream_name.empty()) return {core::tier::server};
  return {core::tier::server, core::tier::edge};
}

// A micro-batch's loss, into the round's figures, and its statistics where it was computed here.
void count_loss(runtime::round_tally& seen, runtime::round_tally& own, const runtime::step_result& res) {
  seen.add_loss(res.loss, res.n_samples, res.n_correct);
  if (res.loss_here) own.add_loss(res.loss, res.n_samples, res.n_correct);
}

}  // namespace

agent::impl::impl(agent_config c) : c_(std::move(c)), ex_("device " + std::to_string(c_.id)), wake_(ex_.work()) {
  if (c_.id == 0) throw core::error("device id not set: agent_config::id (--id) must be > 0, unique in the federation");
  if (c_.upstream_role == core::tier::device) throw core::error("a device's upstream is a server or an edge");
  if (!(c_.slowdown >= 1.0)) throw core::error("slowdown must be >= 1");
  if (c_.order_seed == 0) c_.order_seed = default_order_seed(c_.partition_seed, c_.id);
  if (!(c_.activation_clip >= 0) || !(c_.activation_noise >= 0) || !(c_.nopeek >= 0))
    throw core::error("--activation-clip, --activation-noise and --nopeek must be >= 0");
  if (c_.activation_noise > 0 && c_.activation_clip <= 0)
    throw core::error(
        fmt::format("--activation-noise {:g} needs --activation-clip: the noise is scaled to the "
                    "clipping bound",
                    c_.activation_noise));
  if (!(c_.dp_delta > 0 && c_.dp_delta < 1)) throw core::error("--dp-delta must be in (0, 1)");
  if (c_.gradient_check_window < 1) throw core::error("--gradient-check-window must be >= 1");
  for (const auto& h : c_.allowed_models)
    if (h.size() != 64 || h.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw core::error("--allow-model '" + h + "': expected a SHA-256 as 64 lowercase hex digits");
  offer_of(c_, "");  // every --offer is NAME=DIR
  if (c_.min_device_blocks < 0) throw core::error("--min-device-blocks must be >= 0");
  if (c_.secagg_min_roster < 2)
    throw core::error("--secagg-min-roster " + std::to_string(c_.secagg_min_roster) +
                      ": a roster needs at least 2 devices (one alone would be decoded as it is)");
}

agent::agent(agent_config c) : impl_(std::make_unique<impl>(std::move(c))) {}
agent::~agent() = default;
int agent::run() {
  return impl_->run();
}
void agent::stop() {
  impl_->stop();
}
void agent::stop_on_signals() {
  impl_->stop_on_signals();
}
std::string agent::data_set_wanted() const {
  return impl_->data_wanted_;
}

void agent::impl::post(transport::message_builder&& m) {
  if (c_.on_send) c_.on_send(m.frame());
  up_->post(std::move(m));
}

void agent::impl::on_connected(const runtime::session_ptr& s) {
  protocol::hello_info h;
  h.role = core::tier::device;
  h.node_id = c_.id;
  h.name = c_.name;
  h.n_samples = static_cast<std::uint64_t>(shard_->size());
  post(protocol::make_hello(h));
  schedule_->apply(s->ch, s->identity);
  std::lock_guard lock(profile_mu_);
  if (!latest_profile_.empty()) post(transport::message_builder::from_frame(latest_profile_));
}

void agent::impl::on_message(transport::message m) {
  switch (m.type()) {
    case wire::Body::RoundStart: {
      const auto& r = *m.as<wire::RoundStart>();
      if (r.device_id() != 0 && r.device_id() != c_.id) return;
      runtime::advance_schedule(*schedule_, r.round(), {up_->current()}, ex_, runner_);
      break;
    }
    case wire::Body::Migrate: {
      const auto* mg = m.as<wire::Migrate>();
      if (mg->device_id() != c_.id || protocol::tier_of(mg->to_role()) != core::tier::device)
        throw core::error("Migrate for device " + std::to_string(mg->device_id()) + " reached device " +
                          std::to_string(c_.id));
      break;
    }
    case wire::Body::Plan:
    case wire::Body::GlobalWeights:
    case wire::Body::Activations:
    case wire::Body::Gradients:
    case wire::Body::SecAgg:
      break;
    case wire::Body::Revocations:
      return runtime::adopt_revocations(ex_, *tls_, nullptr, &*up_, *m.as<wire::Revocations>());
    default:
      return;  // Welcome, heartbeats
  }
  auto held = std::make_shared<transport::message>(std::move(m));
  ex_.post_compute(ex_.guarded([this, held] { handle(held); }, [this](const std::string& why) { up_->drop(why); }));
}

void agent::impl::handle(const std::shared_ptr<transport::message>& m) {
  switch (m->type()) {
    case wire::Body::Plan:
      return on_plan(*m->as<wire::Plan>());
    case wire::Body::GlobalWeights:
      return on_global_weights(*m->as<wire::GlobalWeights>());
    case wire::Body::RoundStart:
      return on_round_start(*m->as<wire::RoundStart>());
    case wire::Body::Migrate:
      return on_migrate(*m->as<wire::Migrate>());
    case wire::Body::SecAgg:
      return on_secagg(*m->as<wire::SecAgg>());
    default:
      return on_step(m);
  }
}

void agent::impl::abandon(const std::string& why) {
  if (in_round_) spdlog::warn("device {}: round {} abandoned: {}", c_.id, round_, why);
  ++round_gen_;
  in_round_ = false;
  wake_.notify();
  if (runner_->has_model()) runner_->discard(c_.id);
  labels_.clear();
}

void agent::impl::on_plan(const wire::Plan& p) {
  // A plan it can never take ends the agent; with --stay it refuses this job's (the next may do).
  const auto never = [this](const core::error& err) {
    if (c_.stay) throw err;
    ex_.post_io([this, e = std::make_exception_ptr(err)] { ex_.fail(e, "joining"); });
  };
  const std::string json = p.model() ? p.model()->str() : "";
  if (json != model_.json) {
    auto m = core::parse_model_spec(json, "plan");
    if (!(m.input == item_) || m.n_classes < n_classes_)
      return never(core::error("the server's model takes " + m.input.str() + " inputs and " +
                               std::to_string(m.n_classes) + " classes; this device's data has " + item_.str() +
                               " and " + std::to_string(n_classes_)));
    model_ = std::move(m);
  }
  const std::string dataset = p.dataset() ? p.dataset()->str() : "";
  if (c_.stay && !dataset.empty() && dataset != held_data_set(c_) && !offer_of(c_, dataset).empty()) {
    data_wanted_ = offer_of(c_, dataset);  // another it offers: this run ends, the next holds it
    ex_.post_io([this, dataset] { ex_.stop("the job trains on data set '" + dataset + "': loading it"); });
    return;
  }
  const split::route route = protocol::route_for(p, c_.id, model_.n_blocks());
  const auto training = protocol::training_of(p);
  // Refused: the link drops with the reason, the agent stays up.
  check_plan_policy(c_, model_, route, {training.opt, p.micro_batch_size(), memory_budget_, dataset});
  secure_plan_ = p.secure_aggregation();
  if ((c_.cut_gradient_noise >= 0 || c_.equalise_cut_gradients) && !route.u_shape() && !plan_)
    spdlog::warn(
        "device {}: --cut-gradient-noise and --equalise-cut-gradients protect labels in U-shaped plans only; here "
        "the server computes the loss",
        c_.id);
  if (c_.secure_aggregation && !secure_plan_)
    return never(
        core::error("the server does not aggregate securely (its plan would have this device upload its "
                    "replicas in the clear), and this device runs with --secure-aggregation"));
  edge_id_ = 0;  // a device that reconnects directly has none
  for (const auto* dp : *p.devices())
    if (dp->device_id() == c_.id && dp->stages())
      for (const auto* st : *dp->stages())
        if (st->role() == wire::Role::edge) edge_id_ = st->node_id();
  // How its steps cross each hop (a message names its own codec, so a change may apply at once).
  runner_->set_cut(c_.id, protocol::cut_settings_for(p, c_.id, route));
  if (p.resplit() && plan_) return plan_->announce(route, p.epoch());  // switched at the next step boundary
  // A new plan (a join or a rejoin): segments start from the seed, the global weights follow;
  // resuming from the server's checkpoint under the same run and route they keep their
  // optimizer state.
  const bool same_run = p.resume() && p.run_id() != 0 && p.run_id() == run_id_ && plan_ && plan_->route == route;
  run_id_ = p.run_id();
  if (!same_run) started_.reset();
  if (in_round_) abandon("a new plan arrived");
  missing_ = 0;
  const bool reprofile = p.micro_batch_size() != micro_batch_size_;
  micro_batch_size_ = p.micro_batch_size();
  n_micro_batches_ = std::max(1u, p.n_micro_batches());
  plan_.emplace().reset(route, p.epoch());
  spdlog::info("device {}: plan {}: {} (batch {} x {})", c_.id, p.epoch(), route.str(), micro_batch_size_,
               n_micro_batches_);
  const bool fresh = runner_->set_model(json, training);
  if (fresh || !same_run) {
    runner_->discard(c_.id, true);
    for (int seg : route.segments_on(core::tier::device)) runner_->host().host(c_.id, route, seg);
    started_.reset();
  } else {
    runner_->discard(c_.id);  // nothing of a step in flight survives a new plan
  }
  // Every block timed on this board before training, so the server's plan is informed from the
  // first round.
  if (fresh || reprofile) {
    runner_->profile(micro_batch_size_, training, memory_budget_);
    send_profile(0);
  }
}

void agent::impl::on_global_weights(const wire::GlobalWeights& g) {
  if (!plan_) return;
  // Weights of a round closed while this device was still in it: it missed the deadline.
  if (in_round_ && g.round() >= round_) abandon("the server closed it without this device");
  const auto w = protocol::weights_of(g, runner_->model());
  check_global_weights(g.round(), w.params, w.buffers);
  runner_->load(c_.id, plan_->route, w.params, w.buffers);
  if (c_.on_weights) c_.on_weights(g.round());
  if (g.round() > 0)
    spdlog::info(
        "device {}: global weights of round {} installed{}", c_.id, g.round(),
        std::isnan(g.test_accuracy()) ? std::string() : fmt::format(" (test accuracy {:.4f})", g.test_accuracy()));
}

void agent::impl::on_round_start(const wire::RoundStart& r) {
  if (!plan_) {
    spdlog::warn("device {}: round {} started before a plan arrived; skipping it", c_.id, r.round());
    return;
  }
  if (in_round_) abandon("round " + std::to_string(r.round()) + " started");
  if (started_ && started_->round == r.round() && started_->route == plan_->route) {
    runner_->restore_optimizer(c_.id, plan_->route, started_->optimizer);
    position_ = started_->position;
    spdlog::info("device {}: round {} again, from the state it first started with", c_.id, r.round());
  } else {
    started_ = round_start{r.round(), plan_->route, runner_->optimizer_states(c_.id, plan_->route), position_};
  }
  round_ = r.round();
  attempt_ = r.attempt();
  in_round_ = true;
  secure_.reset();
  if (secure_plan_) {
    secure_.emplace(secure_round{privacy::secagg_client(c_.id, r.round())});
    const auto mine =
        protocol::signed_keys(*tls_, r.round(), c_.id, secure_->client.mask_public(), secure_->client.encrypt_public());
    post_secagg(
        {.phase = wire::SecAggPhase::keys, .round = r.round(), .device_id = c_.id, .keys = std::span(&mine, 1)});
  }
  // A sign of this round's work goes up at least this often: the server counts out a device it
  // hears nothing of for a quarter of its deadline.
  progress_every_ = runtime::progress_every(std::chrono::milliseconds(r.deadline_ms()));
  ex_.spawn(run_round(r.round(), r.local_steps(), r.learning_rate(), ++round_gen_), "a round",
            runtime::executors::thread::compute);
}

void agent::impl::on_migrate(const wire::Migrate& m) {
  if (!plan_ || m.epoch() != plan_->epoch) return;  // of a plan that is over
  runner_->install(c_.id, m);
  missing_ = runner_->host().n_missing(c_.id);
  wake_.notify();
}

void agent::impl::on_step(const std::shared_ptr<transport::message>& m) {
  const auto key = *protocol::step_key_of(*m);
  if (!in_round_ || !plan_ || key.epoch != plan_->epoch || key.attempt != attempt_ || key.device_id != c_.id)
    return;  // of a round, an attempt at it or a plan that is over
  auto task = [this, m, gen = round_gen_, r = plan_->route, epoch = key.epoch] {
    if (over(gen)) return;  // held while blocks migrated, and the round ended meanwhile
    const auto* a = m->as<wire::Activations>();
    std::map<split::micro_batch_id, core::tensor>::iterator lab;
    if (a) {  // U-shape: the top segment, with the labels kept here
      lab = labels_.find({a->step(), a->micro_batch()});
      if (lab == labels_.end()) return;  // of a step abandoned
    }
    const core::tier from = a ? r.path[r.path.size() - 2] : r.path[1];
    auto res = runner_->run(c_.id, r, epoch, from, *m, a ? &lab->second : nullptr);
    if (a) labels_.erase(lab);
    const bool back = !res.out;  // a gradient through the bottom: the micro-batch is done
    if (res.out) post(std::move(*res.out));
    if (res.loss_here || (back && !r.u_shape())) count_loss(seen_, own_, res);
    if (back) check_gradients();
    if (back && ++back_ >= n_micro_batches_) wake_.notify();
  };
  runner_->submit(c_.id, std::move(task));
}

asio::awaitable<void> agent::impl::run_round(std::uint64_t round, std::uint32_t steps, float lr, std::uint64_t gen) {
  seen_ = own_ = {};
  const auto t0 = clock::now();
  if (lr > 0) runner_->host().set_learning_rate(c_.id, lr);  // 0: the plan's rate
  runner_->take_compute_seconds();
  std::uint64_t n_samples = 0;
  last_progress_ = t0;
  // Blocks still migrating here: a long transfer is no silence, a profile at the round's first
  // step says this device is in it meanwhile (and likewise at a cut-over below).
  const auto blocks_here = [&] { return missing_ == 0 || over(gen); };
  while (!co_await wake_.wait_until(blocks_here, clock::now() + progress_every_)) send_profile(round * steps);
  for (std::uint32_t i = 0; i < steps && !over(gen); ++i) {
    const std::uint64_t step = round * steps + i;
    if (plan_->next && !co_await cut_over(step, gen)) break;
    back_ = 0;
    forward_step(step);
    co_await wake_.wait_until([&] { return back_ >= n_micro_batches_ || over(gen); });
    // What came in meanwhile runs before the next step (with every block here the step did
    // not wait for anything): a re-split, the round's end, a stop.
    const auto exec = co_await asio::this_coro::executor;
    co_await asio::post(exec, asio::use_awaitable);
    if (over(gen)) break;
    n_samples += static_cast<std::uint64_t>(micro_batch_size_) * n_micro_batches_;
    const auto up = up_->current();
    const bool moved = up && runtime::bandwidth_moved(reported_bps_, up->measured_link(edge_id_).bandwidth_bytes_per_s);
    if (++steps_since_profile_ >= c_.profile_every || moved || clock::now() - last_progress_ >= progress_every_) {
      steps_since_profile_ = 0;
      send_profile(step);
    }
  }
  if (over(gen)) co_return;
  in_round_ = false;
  const double secs = std::chrono::duration<double>(clock::now() - t0).count();
  // The loss is reported by whoever computed it: here in U-shape, or with every block here.
  const protocol::round_stats stats = own_.as_stats(runner_->take_compute_seconds(), 0);
  upload_replicas(round, n_samples, stats);
  send_profile(round * steps + steps);
  const double loss = seen_.n_loss ? seen_.mean_loss() : std::nan("");
  spdlog::info("device {}: round {}: {} steps in {:.1f} s (compute {:.1f} s), loss {:.4f}", c_.id, round, steps, secs,
               static_cast<double>(stats.compute_us) * 1e-6, loss);
  auto& m = ex_.metrics();
  report_privacy(round);
  m.add("cleave_rounds_completed_total", {});
  m.set("cleave_round", {}, static_cast<double>(round));
  m.add("cleave_steps_total", {}, static_cast<double>(steps));
  m.add("cleave_compute_seconds_total", {{"tier", "device"}}, static_cast<double>(stats.compute_us) * 1e-6);
  m.set("cleave_step_seconds", {}, secs / static_cast<double>(std::max<std::uint64_t>(1, steps)));
  if (!std::isnan(loss)) m.set("cleave_train_loss", {}, loss);
  if (c_.on_round) c_.on_round(round, loss);
}

asio::awaitable<bool> agent::impl::cut_over(std::uint64_t step, std::uint64_t gen) {
  const auto t0 = clock::now();
  // The new plan is in force from here: blocks for it may arrive before the switch is done.
  const split::route from = plan_->cut_over(plan_->next_epoch), to = plan_->route;
  const protocol::migrate_desc md{plan_->epoch, step, c_.id, edge_id_, core::tier::device, c_.id};
  // Under secure aggregation a device's optimizer state (its gradients, accumulated) stays here.
  auto moved = runner_->rehost(c_.id, from, to, md, secure_plan_);
  runtime::count_migration(ex_.metrics(), moved);
  const std::size_t n_moved = moved.size();
  for (auto& [tier, msg] : moved) post(std::move(msg));
  post(protocol::make_cutover(c_.id, md.epoch, md.step));
  missing_ = runner_->host().n_missing(c_.id);
  // The blocks coming down from the edge or the server.
  const auto blocks_here = [&] { return missing_ == 0 || over(gen); };
  while (!co_await wake_.wait_until(blocks_here, clock::now() + progress_every_)) send_profile(step);
  if (over(gen)) co_return false;
  const double secs = std::chrono::duration<double>(clock::now() - t0).count();
  spdlog::info("device {}: plan {} from step {}: {} -> {} ({} block range{} sent, {:.1f} ms)", c_.id, md.epoch, step,
               from.str(), to.str(), n_moved, n_moved == 1 ? "" : "s", secs * 1e3);
  ex_.metrics().add("cleave_resplits_total", {});
  ex_.metrics().add("cleave_migration_seconds_total", {}, secs);
  co_return true;
}

void agent::impl::forward_step(std::uint64_t step) {
  const std::uint32_t mbs = micro_batch_size_, n_mb = n_micro_batches_;
  const std::int64_t per = item_.numel();
  std::vector<float> xb(static_cast<std::size_t>(mbs * n_mb * per));
  std::vector<std::int32_t> yb(static_cast<std::size_t>(mbs * n_mb));
  next_batch(mbs * n_mb, xb.data(), yb.data());
  auto& be = runner_->backend();
  for (std::uint32_t mb = 0; mb < n_mb; ++mb) {
    const auto n = static_cast<std::int64_t>(mbs);
    core::tensor x = be.empty(model_.input.batched(n));
    core::tensor y = be.empty({n}, core::dtype::i32);
    be.upload(x, xb.data() + mb * mbs * per);
    be.upload(y, yb.data() + mb * mbs);
    if (plan_->route.u_shape()) labels_[{step, mb}] = y;
    auto res = runner_->run_input(c_.id, plan_->route, plan_->epoch, attempt_, {step, mb}, x, y, {mbs * n_mb, n_mb},
                                  std::span<const std::int32_t>(yb.data() + mb * mbs, mbs));
    if (res.out) {
      post(std::move(*res.out));
    } else {  // every block here: the micro-batch went into the loss and back
      count_loss(seen_, own_, res);
      ++back_;
    }
  }
}

void agent::impl::next_batch(std::int64_t n, float* x, std::int32_t* y) {
  const std::int64_t size = shard_->size();
  for (std::int64_t i = 0; i < n; ++i, ++position_) {
    const std::int64_t epoch = position_ / size;
    if (epoch != order_epoch_) {  // a new pass over the shard: its own shuffled order
      order_ = core::epoch_order(size, c_.order_seed, epoch);
      order_epoch_ = epoch;
    }
    const std::int64_t idx = order_[static_cast<std::size_t>(position_ % size)];
    if (c_.activation_noise > 0) {
      if (releases_.size() != static_cast<std::size_t>(size)) releases_.assign(static_cast<std::size_t>(size), 0);
      ++releases_[static_cast<std::size_t>(idx)];
    }
    shard_->fetch_augmented(&idx, 1, x + i * item_.numel(), y + i, c_.augment, c_.order_seed, epoch);
  }
}

void agent::impl::send_profile(std::uint64_t step) {
  last_progress_ = clock::now();
  auto prof = runner_->snapshot(memory_budget_);
  const std::uint32_t epoch = plan_ ? plan_->epoch : 0;
  {
    std::lock_guard lock(profile_mu_);
    const auto b = protocol::make_profile(prof, epoch, 0);
    latest_profile_.assign(b.frame().begin(), b.frame().end());
  }
  if (const auto s = up_->current()) {
    prof.links.push_back(s->measured_link(edge_id_));
    reported_bps_ = prof.links.back().bandwidth_bytes_per_s;
  }
  post(protocol::make_profile(prof, epoch, step));
}

int agent::impl::run() {
  schedule_.emplace(c_.schedule, c_.name, ex_.who());  // configuration errors first
  tls_.emplace(transport::tls_files_in(c_.certs, c_.name));
  if (const auto bound = tls_->node_id(); !bound || *bound != c_.id)
    throw core::error("device id " + std::to_string(c_.id) + " does not match certificate '" + c_.name + "' (" +
                      (bound ? "it is for device " + std::to_string(*bound) : "it binds no id") + ")");
  be_ = backend::make_backend(c_.backend);
  // Only this device's shard stays in memory; the test split is the server's. An app's own
  // source is split by its labels exactly as a file's training split is.
  auto pick = [this](const std::vector<std::int32_t>& labels, int n_classes) {
    return core::pick_shard(c_.partition, labels, n_classes, c_.n_shards, c_.shard, c_.partition_seed);
  };
  if (c_.source) {
    core::check_source(*c_.source);
    shard_ = core::subset_of(c_.source, pick(c_.source->labels(), c_.source->class_count()));
  } else {
    core::load_options lo;
    lo.test = false;
    lo.pick_train = pick;
    shard_ = std::make_shared<core::dataset>(std::move(core::load_dataset(c_.data, lo).train));
  }
  item_ = shard_->sample_shape();
  n_classes_ = shard_->class_count();
  memory_budget_ = c_.memory_budget ? c_.memory_budget : split::default_memory_budget();
  runner_.emplace(*be_, core::tier::device, c_.id, schedule_->start_slowdown(c_.slowdown));
  runner_->set_filters(privacy::device_filters(
      {c_.activation_clip, c_.activation_noise, c_.nopeek, c_.cut_gradient_noise, c_.equalise_cut_gradients,
       c_.gradient_check != gradient_check_mode::off ? c_.gradient_check_window : 0, c_.gradient_check_threshold,
       c_.order_seed, c_.on_gradient}));
  if (c_.activation_clip > 0)
    spdlog::info("device {}: activations leave clipped to L2 norm {:g}{}", c_.id, c_.activation_clip,
                 c_.activation_noise > 0
                     ? fmt::format(" with Gaussian noise of std {:g}", c_.activation_noise * c_.activation_clip)
                     : std::string());
  if (c_.shared_board) runner_->share_board(c_.shared_board);
  spdlog::info("device {} ({}): {} samples of {} (shard {}/{}, {}), backend {} ({})", c_.id, c_.name, shard_->size(),
               shard_->describe(), c_.shard, c_.n_shards, core::partition_name(c_.partition), be_->name(),
               be_->device_name());
  if (c_.augment.any()) spdlog::info("device {}: augmenting its batches ({})", c_.id, core::augment_str(c_.augment));
  auto lost = [this](const std::string& why) {
    spdlog::warn("device {}: link lost: {}", c_.id, why);
    // What was in flight went with the link; the server counts this device out of the round.
    ex_.post_compute([this] { abandon("the link was lost"); });
  };
  up_.emplace(ex_, *tls_, c_.upstream_host, c_.upstream_port, c_.upstream_name, upstream_roles(c_), c_.links,
              runtime::upstream::handlers{[this](const runtime::session_ptr& s) { on_connected(s); },
                                          [this](transport::message m) { on_message(std::move(m)); }, lost});
  ex_.collect_on_io([this] { up_->publish_links(); });
  if (!c_.metrics.empty())
    ex_.serve_metrics(c_, [this] { return up_->current() ? std::string() : "not connected to its upstream"; });
  ex_.on_reload([this] { runtime::reload_credentials(ex_, *tls_, nullptr, &*up_); });
  ex_.on_shutdown([this](std::string why) -> asio::awaitable<void> {
    spdlog::info("device {}: {}", c_.id, why);
    ex_.post_compute([this] {  // the round in progress ends
      ++round_gen_;
      wake_.notify();
    });
    co_await up_->shutdown();
  });
  ex_.spawn(up_->run(), "the upstream link");
  ex_.run();
  return 0;
}

}  // namespace cleave::device
