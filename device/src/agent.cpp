// The device agent: an I/O thread runs the channel (connect, read, ordered sends, reconnect);
// the calling thread trains, waiting on the events the I/O thread hands it.
#include "cleave/device/agent.h"

#include <spdlog/spdlog.h>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <thread>
#include <variant>

#include "cleave/backend/registry.h"
#include "cleave/core/dataset.h"
#include "cleave/core/partition.h"
#include "cleave/core/pipeline.h"
#include "cleave/core/profiler.h"
#include "cleave/core/random.h"
#include "cleave/transport/connect.h"
#include "cleave/transport/emulation.h"
#include "cleave/transport/outbox.h"
#include "cleave/transport/protocol.h"
#include "cleave/transport/tensor_io.h"
#include "event_queue.h"

namespace cleave::device {

namespace {

using clock = std::chrono::steady_clock;

struct connected {};
struct disconnected {
  std::string reason;
};
using event = std::variant<transport::message, connected, disconnected>;

// The shard this device holds.
core::shard pick_shard(const agent_config& c, const core::dataset& train) {
  if (c.n_shards < 1 || c.shard < 0 || c.shard >= c.n_shards)
    throw core::error("shard " + std::to_string(c.shard) + " of " + std::to_string(c.n_shards) + " does not exist");
  const std::string& p = c.partition;
  std::vector<core::shard> all;
  if (p == "all") {
    core::shard s(static_cast<std::size_t>(train.size()));
    for (std::int64_t i = 0; i < train.size(); ++i) s[static_cast<std::size_t>(i)] = i;
    return s;
  }
  if (p == "iid") {
    all = core::partition_iid(train.size(), c.n_shards, c.partition_seed);
  } else if (p.rfind("dirichlet:", 0) == 0) {
    double alpha = 0;
    try {
      alpha = std::stod(p.substr(10));
    } catch (...) {
      throw core::error("partition '" + p + "': expected dirichlet:ALPHA, e.g. dirichlet:0.5");
    }
    all = core::partition_dirichlet(train.y, train.n_classes, c.n_shards, alpha, c.partition_seed);
  } else if (p.rfind("classes:", 0) == 0) {
    int k = 0;
    try {
      k = std::stoi(p.substr(8));
    } catch (...) {
      throw core::error("partition '" + p + "': expected classes:K, e.g. classes:2");
    }
    all = core::partition_classes(train.y, train.n_classes, c.n_shards, k, c.partition_seed);
  } else {
    throw core::error("partition '" + p + "': expected iid, dirichlet:ALPHA, classes:K or all");
  }
  return all[static_cast<std::size_t>(c.shard)];
}

}  // namespace

std::uint64_t default_order_seed(std::uint64_t partition_seed, std::uint32_t id) {
  return core::mix64(partition_seed ^ (0xde71ce00ULL + id));
}

class agent::impl {
 public:
  explicit impl(agent_config c) : c_(std::move(c)) {
    if (c_.id == 0) throw core::error("device id must be > 0");
    if (!(c_.slowdown >= 1.0)) throw core::error("slowdown must be >= 1");
    if (c_.order_seed == 0) c_.order_seed = default_order_seed(c_.partition_seed, c_.id);
  }

  int run();
  void stop() {
    stop_.store(true);
    io_.stop();
  }

 private:
  // ---- I/O thread ----
  asio::awaitable<void> connect_loop();
  void send(transport::message_builder&& m);

  // ---- training thread ----
  std::optional<event> next_event(std::chrono::milliseconds timeout = std::chrono::milliseconds(200));
  // Handles an event that is not part of a step; returns false when the run is over.
  bool handle(event& e);
  void on_plan(const wire::Plan& p);
  void on_global_weights(const wire::GlobalWeights& g);
  void run_round(const wire::RoundStart& r);
  // Waits for the step's micro-batches to come back; false when the round was abandoned.
  bool finish_step(std::uint64_t step, std::uint32_t n_micro_batches);
  // Switches to the pending plan before `step`: hands over the blocks leaving this device, tells
  // the route (Cutover), and waits for the blocks arriving; false when the round was abandoned.
  bool cut_over(std::uint64_t step);
  void on_migrate(const wire::Migrate& m);
  void upload_replicas(std::uint64_t round, std::uint64_t n_samples);
  // Runs f, timing it (and stretching it by the slowdown); seg >= 0 adds the time to that
  // segment's share of the current step.
  void timed_compute(const std::function<void()>& f, int seg = -1);
  // Sends this device's current profile (with its link's measurements) upstream.
  void send_profile(std::uint64_t step);
  void apply_schedule(std::uint64_t round);
  void next_batch(std::int64_t n, float* x, std::int32_t* y);

  agent_config c_;
  std::atomic<bool> stop_{false};
  asio::io_context io_;
  event_queue<event> events_;

  // I/O thread state.
  transport::channel ch_;
  std::shared_ptr<transport::outbox> out_;
  std::mutex out_mu_;

  // Training thread state.
  core::dataset_split data_;
  core::shard shard_;
  std::int64_t position_ = 0;  // samples drawn from this device's data stream
  std::vector<std::int64_t> order_;
  std::int64_t order_epoch_ = -1;
  std::unique_ptr<core::backend> be_;
  core::model_spec model_;
  std::string model_json_;
  std::unique_ptr<core::segment_host> host_;
  core::route route_;
  bool have_plan_ = false;
  std::uint32_t plan_epoch_ = 0;
  std::uint32_t edge_id_ = 0;  // the edge on the route (0: none)
  struct pending_plan {
    core::route route;
    std::uint32_t epoch = 0;
    std::uint32_t edge_id = 0;
  };
  std::optional<pending_plan> pending_;  // a re-split waiting for the next step boundary
  std::uint32_t micro_batch_size_ = 0, n_micro_batches_ = 1;
  bool done_ = false;
  // In U-shape the labels of each micro-batch in flight wait here for the top segment.
  std::map<core::micro_batch_id, core::tensor> labels_;
  std::uint64_t round_ = 0;
  bool round_abandoned_ = false;
  // Profiles: the blocks timed at start, rescaled by the steps as they run.
  core::live_profile live_;
  std::uint32_t profile_batch_ = 32;
  std::uint64_t memory_budget_ = 0;
  std::map<int, double> seg_seconds_;  // this step's compute per device segment
  int steps_since_profile_ = 0;
  std::mutex profile_mu_;
  std::optional<transport::node_profile> latest_profile_;  // sent again after a reconnect
  transport::emulation_schedule schedule_;
  std::optional<transport::link_caps> caps_;  // I/O thread: the emulated upstream link
  // Round statistics.
  double compute_s_ = 0;
  double loss_sum_ = 0;
  std::uint64_t n_loss_ = 0, n_correct_ = 0;
};

agent::agent(agent_config c) : impl_(std::make_unique<impl>(std::move(c))) {}
agent::~agent() = default;
int agent::run() {
  return impl_->run();
}
void agent::stop() {
  impl_->stop();
}

asio::awaitable<void> agent::impl::connect_loop() {
  const transport::tls_context tls(transport::tls_files_in(c_.certs, c_.name));
  double backoff = 0.2;
  while (!stop_.load()) {
    transport::connect_options opts;
    if (!c_.upstream_name.empty()) opts.server_identity = c_.upstream_name;
    auto r = co_await transport::connect(tls, c_.upstream_host, c_.upstream_port, opts);
    if (!r) {
      spdlog::warn("device {}: cannot reach {}:{}: {}; retrying in {:.1f} s", c_.id, c_.upstream_host, c_.upstream_port,
                   r.error().reason(), backoff);
      asio::steady_timer t(io_, std::chrono::milliseconds(static_cast<int>(backoff * 1000)));
      co_await t.async_wait(asio::use_awaitable);
      backoff = std::min(c_.reconnect_max_s, backoff * 2);
      continue;
    }
    backoff = 0.2;
    ch_ = std::move(r.value());
    {
      std::lock_guard lock(out_mu_);
      out_ = std::make_shared<transport::outbox>(ch_);
    }
    spdlog::info("device {}: connected to {} ({})", c_.id, ch_.peer_identity(), ch_.remote());
    transport::hello_info h;
    h.role = transport::node_role::device;
    h.node_id = c_.id;
    h.name = c_.name;
    h.n_samples = static_cast<std::uint64_t>(shard_.size());
    send(transport::make_hello(h));
    if (caps_) ch_.emulator().set(*caps_);
    {
      std::lock_guard lock(profile_mu_);
      if (latest_profile_) send(transport::make_profile(*latest_profile_, plan_epoch_, 0));
    }
    events_.push(connected{});
    for (;;) {
      auto m = co_await ch_.receive();
      if (!m) {
        events_.push(disconnected{m.error().reason()});
        break;
      }
      events_.push(std::move(m.value()));
    }
    {
      std::lock_guard lock(out_mu_);
      out_.reset();
    }
    ch_ = transport::channel{};
    if (done_ || stop_.load()) break;
  }
}

void agent::impl::send(transport::message_builder&& m) {
  if (c_.on_send) c_.on_send(m.frame());
  std::lock_guard lock(out_mu_);
  if (out_) out_->post(std::move(m));
}

std::optional<event> agent::impl::next_event(std::chrono::milliseconds timeout) {
  return events_.pop(timeout);
}

void agent::impl::timed_compute(const std::function<void()>& f, int seg) {
  const auto t0 = clock::now();
  f();
  be_->synchronize();
  const double secs = std::chrono::duration<double>(clock::now() - t0).count();
  compute_s_ += secs;
  if (seg >= 0) seg_seconds_[seg] += secs * c_.slowdown;
  if (c_.slowdown > 1.0) {
    // Emulates a board this many times slower: wait for the extra time it would have taken.
    std::this_thread::sleep_for(std::chrono::duration<double>(secs * (c_.slowdown - 1.0)));
    compute_s_ += secs * (c_.slowdown - 1.0);
  }
}

void agent::impl::send_profile(std::uint64_t step) {
  auto prof = transport::current_profile(live_, c_.id, profile_batch_, be_->name(), memory_budget_);
  {
    std::lock_guard lock(profile_mu_);
    latest_profile_ = prof;
  }
  steps_since_profile_ = 0;
  // The link's figures live on the I/O thread.
  asio::post(io_, [this, prof = std::move(prof), epoch = plan_epoch_, step, up = edge_id_]() mutable {
    if (!ch_) return;
    const auto st = ch_.stats();
    prof.links.push_back(
        {up, static_cast<float>(transport::link_rtt_us(st)), static_cast<float>(transport::link_bytes_per_second(st))});
    send(transport::make_profile(prof, epoch, step));
  });
}

void agent::impl::apply_schedule(std::uint64_t round) {
  for (const auto& ev : schedule_.at(static_cast<int>(round), c_.name)) {
    if (ev.what == transport::emulation_event::kind::slowdown) {
      c_.slowdown = ev.slowdown;
      spdlog::info("device {}: {}", c_.id, ev.str());
      continue;
    }
    const std::string up = c_.upstream_name.empty() ? "*" : c_.upstream_name;
    if (!transport::name_matches(ev.b, up) && ev.b != "*") continue;
    spdlog::info("device {}: {}", c_.id, ev.str());
    asio::post(io_, [this, caps = ev.caps] {
      caps_ = caps;
      if (ch_) ch_.emulator().set(caps);
    });
  }
}

void agent::impl::next_batch(std::int64_t n, float* x, std::int32_t* y) {
  const auto size = static_cast<std::int64_t>(shard_.size());
  const std::int64_t per = data_.train.item.numel();
  for (std::int64_t i = 0; i < n; ++i, ++position_) {
    const std::int64_t epoch = position_ / size;
    if (epoch != order_epoch_) {  // a new pass over the shard: its own shuffled order
      order_ = core::epoch_order(size, c_.order_seed, epoch);
      order_epoch_ = epoch;
    }
    const std::int64_t idx = shard_[static_cast<std::size_t>(order_[static_cast<std::size_t>(position_ % size)])];
    data_.train.gather(&idx, 1, x + i * per, y + i);
  }
}

void agent::impl::on_plan(const wire::Plan& p) {
  const std::string model = p.model() ? p.model()->str() : "";
  if (model != model_json_) {
    model_ = core::parse_model_spec(model, "plan");
    if (!(model_.input == data_.train.item) || model_.n_classes < data_.train.n_classes)
      throw core::error("the server's model takes " + model_.input.str() + " inputs and " +
                        std::to_string(model_.n_classes) + " classes; this device's data has " +
                        data_.train.item.str() + " and " + std::to_string(data_.train.n_classes));
    model_json_ = model;
  }
  const auto training = transport::training_of(p);
  const core::route r = transport::route_for(p, c_.id, model_.n_blocks());
  std::uint32_t edge = 0;
  for (const auto* dp : *p.devices())
    if (dp->device_id() == c_.id && dp->stages())
      for (const auto* st : *dp->stages())
        if (st->role() == wire::Role::edge) edge = st->node_id();
  if (p.resplit() && host_ && have_plan_) {
    if (p.epoch() <= plan_epoch_)
      throw core::error("re-split to plan " + std::to_string(p.epoch()) + ", not newer than " +
                        std::to_string(plan_epoch_));
    pending_ = pending_plan{r, p.epoch(), edge};
    spdlog::debug("device {}: plan {} ({}) waits for the next step boundary", c_.id, p.epoch(), r.str());
    return;
  }
  pending_.reset();
  edge_id_ = edge;
  // A new model or micro-batch size: time the blocks (again).
  const bool profile = p.micro_batch_size() != micro_batch_size_ || live_.n_blocks() != model_.n_blocks();
  micro_batch_size_ = p.micro_batch_size();
  n_micro_batches_ = std::max(1u, p.n_micro_batches());
  if (profile) {
    // Every block timed on this board before training (stretched by the emulated slowdown), so
    // the server's plan is informed from the first round.
    const auto t0 = clock::now();
    core::profile_options po;
    po.batch = static_cast<int>(std::max(1u, micro_batch_size_));
    po.seed = training.seed;
    auto base = core::profile_blocks(*be_, model_, training.opt, po);
    double total = 0;
    for (auto& b : base) {
      b.forward_seconds *= c_.slowdown;
      b.backward_seconds *= c_.slowdown;
      total += b.forward_seconds + b.backward_seconds;
    }
    live_ = core::live_profile(std::move(base));
    profile_batch_ = static_cast<std::uint32_t>(po.batch);
    spdlog::info("device {}: profiled {} blocks on {} in {:.2f} s: {:.2f} ms per micro-batch of {}", c_.id,
                 model_.n_blocks(), be_->name(), std::chrono::duration<double>(clock::now() - t0).count(), total * 1e3,
                 po.batch);
    send_profile(0);
  }
  if (!host_ || !have_plan_ || !(r == route_)) {
    // New or changed segments start from the plan's seed; the global weights follow.
    host_ = std::make_unique<core::segment_host>(*be_, model_, training.opt, training.seed);
    for (int seg : r.segments_on(core::tier::device)) host_->host(c_.id, r, seg);
  }
  route_ = r;
  plan_epoch_ = p.epoch();
  have_plan_ = true;
  spdlog::info("device {}: plan {}: {} (batch {} x {})", c_.id, plan_epoch_, route_.str(), micro_batch_size_,
               n_micro_batches_);
}

void agent::impl::on_global_weights(const wire::GlobalWeights& g) {
  if (!have_plan_) return;
  const auto w = transport::weights_of(g, model_);
  for (int seg : route_.segments_on(core::tier::device))
    transport::install(host_->stage_of(c_.id, seg), w.params, w.buffers);
  if (g.round() > 0 || g.test_accuracy() > 0)
    spdlog::info("device {}: global weights of round {} installed (test accuracy {:.4f})", c_.id, g.round(),
                 g.test_accuracy());
}

bool agent::impl::handle(event& e) {
  if (auto* d = std::get_if<disconnected>(&e)) {
    if (done_) return false;
    spdlog::warn("device {}: link lost: {}", c_.id, d->reason);
    if (host_) host_->discard_pending(c_.id);
    labels_.clear();
    return true;
  }
  if (std::holds_alternative<connected>(e)) return true;
  const auto& m = std::get<transport::message>(e);
  switch (m.type()) {
    case wire::Body::Welcome:
      return true;
    case wire::Body::Plan:
      on_plan(*m.as<wire::Plan>());
      return true;
    case wire::Body::GlobalWeights:
      on_global_weights(*m.as<wire::GlobalWeights>());
      return true;
    case wire::Body::Migrate:
      on_migrate(*m.as<wire::Migrate>());
      return true;
    case wire::Body::RoundStart: {
      const auto& r = *m.as<wire::RoundStart>();
      if (r.device_id() == 0 || r.device_id() == c_.id) run_round(r);
      return true;
    }
    case wire::Body::Error: {
      const auto& err = *m.as<wire::Error>();
      const std::string text = err.message() ? err.message()->str() : "";
      if (err.code() == wire::ErrorCode::shutting_down) {
        spdlog::info("device {}: {}", c_.id, text.empty() ? "training finished" : text);
        done_ = true;
        return false;
      }
      spdlog::warn("device {}: upstream error: {}", c_.id, text);
      return true;
    }
    default:
      spdlog::debug("device {}: ignoring {} outside a step", c_.id, transport::describe(m));
      return true;
  }
}

void agent::impl::run_round(const wire::RoundStart& r) {
  if (!have_plan_) {
    spdlog::warn("device {}: round {} started before a plan arrived; skipping it", c_.id, r.round());
    return;
  }
  round_ = r.round();
  round_abandoned_ = false;
  apply_schedule(round_);
  if (r.learning_rate() > 0) host_->set_learning_rate(c_.id, r.learning_rate());  // 0: the plan's rate
  compute_s_ = 0;
  loss_sum_ = 0;
  n_loss_ = n_correct_ = 0;
  const auto t0 = clock::now();
  const std::uint32_t steps = r.local_steps();
  const std::uint32_t mbs = micro_batch_size_, n_mb = n_micro_batches_;
  const std::int64_t per = data_.train.item.numel();
  std::vector<float> xb(static_cast<std::size_t>(mbs * n_mb * per));
  std::vector<std::int32_t> yb(static_cast<std::size_t>(mbs * n_mb));
  const core::shape in = model_.input;
  std::uint64_t n_samples = 0;
  for (std::uint32_t i = 0; i < steps && !round_abandoned_ && !stop_.load(); ++i) {
    const std::uint64_t step = round_ * steps + i;
    if (pending_ && !cut_over(step)) break;
    next_batch(mbs * n_mb, xb.data(), yb.data());
    for (std::uint32_t mb = 0; mb < n_mb; ++mb) {
      const core::micro_batch_id id{step, mb};
      const auto n = static_cast<std::int64_t>(mbs);
      core::tensor x = be_->empty(in.batched(n));
      core::tensor y = be_->empty({n}, core::dtype::i32);
      be_->upload(x, xb.data() + mb * mbs * per);
      be_->upload(y, yb.data() + mb * mbs);
      core::segment_output out;
      timed_compute(
          [&] {
            out = host_->forward(c_.id, 0, id, x, y, 1.0f / static_cast<float>(n_mb), n_mb,
                                 core::hash32(static_cast<std::uint32_t>(step), mb));
          },
          0);
      if (route_.u_shape()) labels_[id] = y;
      const transport::step_key key{plan_epoch_, step, mb, c_.id, static_cast<std::uint32_t>(route_.end(0))};
      send(transport::make_activations(key, {mbs * n_mb, n_mb}, *be_, out.value, route_.u_shape() ? nullptr : &y));
    }
    if (!finish_step(step, n_mb)) break;
    n_samples += mbs * n_mb;
    // What this step's device segments took, in micro-batches of the profiled size.
    for (const auto& [seg, secs] : seg_seconds_)
      if (route_.begin(seg) < route_.end(seg))
        live_.observe(route_.begin(seg), route_.end(seg), secs * profile_batch_ / mbs, static_cast<int>(n_mb));
    seg_seconds_.clear();
    if (++steps_since_profile_ >= c_.profile_every) send_profile(step);
  }
  labels_.clear();
  if (round_abandoned_ || stop_.load()) {
    host_->discard_pending(c_.id);
    return;
  }
  const double secs = std::chrono::duration<double>(clock::now() - t0).count();
  spdlog::info("device {}: round {}: {} steps in {:.1f} s (compute {:.1f} s), loss {:.4f}", c_.id, round_, steps, secs,
               compute_s_, n_loss_ ? loss_sum_ / static_cast<double>(n_loss_) : 0.0);
  upload_replicas(round_, n_samples);
  send_profile(round_ * steps + steps);
}

bool agent::impl::finish_step(std::uint64_t step, std::uint32_t n_micro_batches) {
  std::uint32_t back = 0;
  const int top = route_.n_segments() - 1;
  while (back < n_micro_batches) {
    if (stop_.load()) return false;
    auto e = next_event();
    if (!e) continue;
    auto* m = std::get_if<transport::message>(&*e);
    if (!m) {
      handle(*e);
      if (std::holds_alternative<disconnected>(*e)) {
        round_abandoned_ = true;
        return false;
      }
      continue;
    }
    if (const auto* g = m->as<wire::Gradients>()) {
      if (g->step() != step || g->epoch() != plan_epoch_ || g->device_id() != c_.id ||
          g->block() != static_cast<std::uint32_t>(route_.end(0))) {
        spdlog::debug("device {}: dropping stale {}", c_.id, transport::describe(*m));
        continue;
      }
      const core::micro_batch_id id{step, g->micro_batch()};
      core::tensor dy = transport::to_backend(*be_, transport::view_of(*g->gradient()));
      timed_compute([&] { host_->backward(c_.id, 0, id, dy); }, 0);
      if (!route_.u_shape()) {
        loss_sum_ += static_cast<double>(g->loss()) * dy.shape()[0];
        n_loss_ += static_cast<std::uint64_t>(dy.shape()[0]);
        n_correct_ += g->n_correct();
      }
      ++back;
      continue;
    }
    if (const auto* a = m->as<wire::Activations>(); a && route_.u_shape()) {
      const core::micro_batch_id id{a->step(), a->micro_batch()};
      const auto lab = labels_.find(id);
      if (a->step() != step || a->epoch() != plan_epoch_ || lab == labels_.end() ||
          a->block() != static_cast<std::uint32_t>(route_.begin(top))) {
        spdlog::debug("device {}: dropping stale {}", c_.id, transport::describe(*m));
        continue;
      }
      core::tensor x = transport::to_backend(*be_, transport::view_of(*a->activation()));
      core::segment_output out;
      timed_compute(
          [&] {
            out = host_->forward(c_.id, top, id, x, lab->second, 1.0f / static_cast<float>(n_micro_batches),
                                 n_micro_batches, core::hash32(static_cast<std::uint32_t>(step), id.micro_batch));
          },
          top);
      loss_sum_ += static_cast<double>(out.loss) * x.shape()[0];
      n_loss_ += static_cast<std::uint64_t>(x.shape()[0]);
      n_correct_ += out.n_correct;
      labels_.erase(lab);
      const transport::step_key key{plan_epoch_, step, id.micro_batch, c_.id,
                                    static_cast<std::uint32_t>(route_.begin(top))};
      send(transport::make_gradients(key, *be_, out.value, out.loss, out.n_correct));
      continue;
    }
    if (const auto* gw = m->as<wire::GlobalWeights>(); gw && gw->round() >= round_) {
      // The server closed this round without us (we missed its deadline).
      spdlog::warn("device {}: round {} closed before this device finished; rejoining with the global weights", c_.id,
                   round_);
      on_global_weights(*gw);
      round_abandoned_ = true;
      return false;
    }
    if (!handle(*e)) {
      round_abandoned_ = true;
      return false;
    }
  }
  return true;
}

bool agent::impl::cut_over(std::uint64_t step) {
  const auto t0 = clock::now();
  const pending_plan next = *pending_;
  pending_.reset();
  const core::route from = route_;
  std::vector<core::block_state> lost;
  timed_compute([&] { lost = host_->rehost(c_.id, from, next.route, core::tier::device); });
  const transport::migrate_desc md{next.epoch, step, c_.id, next.edge_id, core::tier::device, c_.id};
  for (const auto& st : lost) send(transport::make_migrate(md, next.route, st));
  send(transport::make_cutover(c_.id, next.epoch, step));
  route_ = next.route;
  plan_epoch_ = next.epoch;
  edge_id_ = next.edge_id;
  // The blocks coming down from the edge or the server.
  while (host_->n_missing(c_.id) > 0) {
    if (stop_.load()) return false;
    auto e = next_event();
    if (!e) continue;
    const bool link_lost = std::holds_alternative<disconnected>(*e);
    if (!handle(*e) || link_lost) {
      round_abandoned_ = true;
      return false;
    }
  }
  spdlog::info("device {}: plan {} from step {}: {} -> {} ({} block range{} sent, {:.1f} ms)", c_.id, plan_epoch_, step,
               from.str(), route_.str(), lost.size(), lost.size() == 1 ? "" : "s",
               std::chrono::duration<double, std::milli>(clock::now() - t0).count());
  return true;
}

void agent::impl::on_migrate(const wire::Migrate& m) {
  if (m.device_id() != c_.id || transport::tier_of(m.to_role()) != core::tier::device)
    throw core::error("Migrate for device " + std::to_string(m.device_id()) + " reached device " +
                      std::to_string(c_.id));
  if (m.epoch() != plan_epoch_) {
    spdlog::debug("device {}: dropping blocks of plan {} (now {})", c_.id, m.epoch(), plan_epoch_);
    return;
  }
  core::block_state st = transport::block_state_of(m, model_);
  timed_compute([&] { host_->install_blocks(c_.id, std::move(st)); });
}

void agent::impl::upload_replicas(std::uint64_t round, std::uint64_t n_samples) {
  const auto segs = route_.segments_on(core::tier::device);
  for (std::size_t i = 0; i < segs.size(); ++i) {
    const int seg = segs[i];
    transport::replica_desc d;
    d.round = round;
    d.node_id = c_.id;
    d.first_block = static_cast<std::uint32_t>(route_.begin(seg));
    d.end_block = static_cast<std::uint32_t>(route_.end(seg));
    d.n_samples = n_samples;
    const std::uint32_t me = c_.id;
    d.devices = std::span(&me, 1);
    d.final_part = i + 1 == segs.size();
    if (d.final_part) {
      d.stats.compute_us = static_cast<std::uint64_t>(compute_s_ * 1e6);
      // The loss is reported by whoever computed it: here only in U-shape.
      if (route_.u_shape()) {
        d.stats.loss_sum = loss_sum_;
        d.stats.n_loss = n_loss_;
        d.stats.n_correct = n_correct_;
      }
    }
    core::stage& st = host_->stage_of(c_.id, seg);
    send(transport::make_replica_upload(d, *be_, st.params(), st.buffers()));
  }
}

int agent::impl::run() {
  schedule_ = transport::parse_schedule(c_.schedule);  // configuration errors first
  be_ = backend::make_backend(c_.backend);
  data_ = core::load_dataset(c_.data);
  shard_ = pick_shard(c_, data_.train);
  memory_budget_ = c_.memory_budget ? c_.memory_budget : core::default_memory_budget();
  spdlog::info("device {} ({}): {} samples of {} (shard {}/{}, {}), backend {} ({})", c_.id, c_.name, shard_.size(),
               c_.data, c_.shard, c_.n_shards, c_.partition, be_->name(), be_->device_name());
  asio::co_spawn(io_, connect_loop(), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  std::exception_ptr io_error;
  std::thread io_thread([&] {
    try {
      io_.run();
    } catch (...) {
      io_error = std::current_exception();
      events_.push(disconnected{"I/O thread failed"});
      stop_.store(true);
    }
  });
  try {
    while (!stop_.load()) {
      auto e = next_event();
      if (!e) continue;
      if (!handle(*e)) break;
    }
  } catch (...) {
    io_.stop();
    io_thread.join();
    throw;
  }
  // Let queued messages (the last uploads) go out, then close.
  asio::post(io_, [this] {
    asio::co_spawn(
        io_,
        [this]() -> asio::awaitable<void> {
          if (ch_) co_await ch_.close();
          io_.stop();
        },
        asio::detached);
  });
  io_thread.join();
  if (io_error) std::rethrow_exception(io_error);
  return 0;
}

}  // namespace cleave::device
