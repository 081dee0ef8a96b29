// The edge node on the node runtime: devices below (an acceptor), the server above (an upstream
// link); the I/O thread relays and keeps the books, the segment runner computes.
#include "cleave/edge/edge_node.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <map>
#include <set>

#include "cleave/backend/registry.h"
#include "cleave/runtime/executors.h"
#include "cleave/runtime/node_metrics.h"
#include "cleave/runtime/segment_runner.h"
#include "cleave/split/aggregate.h"
#include "cleave/split/replica_checks.h"
#include "cleave/transport/protocol.h"

namespace cleave::edge {

using clock = std::chrono::steady_clock;

class edge_node::impl {
 public:
  explicit impl(edge_config c) : c_(std::move(c)), ex_("edge " + std::to_string(c_.id)), flush_timer_(ex_.io()) {}
  int run();
  void stop() { ex_.stop("stopped"); }
  void stop_on_signals() { ex_.stop_on_signals(); }
  std::atomic<std::uint16_t> port_{0};

 private:
  // A part of a device's upload that passed the checks, held until the round's flush.
  struct held_part {
    int first, end;
    std::uint64_t n_samples;
    std::vector<float> params, buffers;
  };
  struct device_state {
    runtime::session_ptr s;        // its current session (null: not connected here)
    std::vector<std::byte> hello;  // passed on to the server again after a reconnect
    runtime::route_state rs;
    bool planned = false, expected = false, done = false;
    std::uint64_t n_samples = 0;   // its upload's, this round
    std::vector<held_part> parts;  // its upload, this round
  };

  // Server side.
  void on_upstream_connected(const runtime::session_ptr& s);
  void on_server(transport::message m);
  void on_plan(const transport::message& m);
  void on_round_start(const wire::RoundStart& r);
  // Device side.
  void on_hello(const runtime::session_ptr& s, const transport::message& hello);
  void on_device(const runtime::session_ptr& s, transport::message m);
  void on_device_closed(const runtime::session_ptr& s, const std::string& why);
  // A part of a device's upload: checked against its plan and steps (a violation closes its
  // channel), held until the flush.
  void on_replica(device_state& d, const wire::ReplicaUpload& r);
  void on_cutover(device_state& d, const transport::message& m);
  // Both: a step message for `dev` from tier `from`, run on the compute thread.
  void step(std::uint32_t dev, transport::message m, core::tier from);
  // Blocks migrating here for the device of session s; a bad one closes that session.
  void install(const runtime::session_ptr& s, transport::message m);
  void relay_down(std::uint32_t dev, const transport::message& m);
  void send_profile(split::node_profile prof);
  void maybe_flush(bool deadline);
  asio::awaitable<void> flush(std::vector<std::uint32_t> done, std::uint64_t round);
  // The parts of the round's upload (per device, or one pre-average) of the devices that finished,
  // with this edge's replicas of each (`mine`, in the order of `done`).
  struct upload_part {
    std::vector<std::uint32_t> devices;
    int first = 0, end = 0;
    std::uint64_t n_samples = 0;
    std::vector<float> params = {}, buffers = {};
    bool final_part = false;
  };
  using replica_sets = std::vector<std::vector<runtime::segment_runner::replica>>;
  std::vector<upload_part> device_parts(const std::vector<std::uint32_t>& done, replica_sets& mine);
  std::vector<upload_part> pre_average(const std::vector<std::uint32_t>& done, const replica_sets& mine);

  edge_config c_;
  runtime::executors ex_;
  std::optional<transport::tls_context> tls_;
  std::optional<runtime::upstream> up_;
  std::optional<runtime::link_schedule> schedule_;
  std::optional<runtime::acceptor> below_;
  std::unique_ptr<core::backend> be_;
  std::optional<runtime::segment_runner> runner_;  // compute thread
  std::string model_json_;
  core::model_spec model_;
  std::uint64_t memory_budget_ = 0;
  int n_steps_ = 0;  // compute thread: device steps seen
  std::optional<split::node_profile> latest_profile_;
  std::map<std::uint32_t, device_state> devices_;
  std::uint64_t run_id_ = 0;  // of the plans in force
  // Compute thread: what each device's segments here started its last round from (a round run
  // again, after the server resumed from its checkpoint, starts from it too).
  struct round_start {
    std::uint64_t round = 0;
    split::route route;
    std::vector<runtime::segment_runner::optimizer_state> optimizer;
  };
  std::map<std::uint32_t, round_start> started_;

  // The round being relayed.
  std::uint64_t round_ = 0;
  bool collecting_ = false, flushing_ = false;
  // The server's aggregation rule needs each device's own replicas (from its Welcome): no
  // pre-average, every device's replicas go up on their own.
  bool per_device_ = false;
  // The server's plans aggregate device replicas securely: devices upload statistics here, their
  // blocks go up masked (SecAgg, relayed as they come) and only this edge's own blocks are summed.
  bool secure_ = false;
  std::uint64_t local_steps_ = 0, batch_ = 0;  // of the round and the plan: the samples a device may claim
  split::replica_ledger uploaded_;             // the blocks each device's upload covered
  std::vector<std::uint32_t> arrived_;         // devices in the order their uploads completed
  clock::time_point last_progress_{};
  std::chrono::milliseconds patience_{0};
  asio::steady_timer flush_timer_;
  transport::round_stats stats_;  // of the devices' uploads
  std::uint64_t bytes_mark_ = 0;
};

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
      if (w->node_id() != c_.id) return relay_down(w->node_id(), m);
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
      transport::weights_of(g, model_);  // checked here, where a bad one drops the link
      std::vector<std::pair<std::uint32_t, split::route>> targets;
      for (auto& [id, d] : devices_)
        if (d.planned && (g.device_id() == 0 || g.device_id() == id)) {
          targets.emplace_back(id, d.rs.route);
          relay_down(id, m);
        }
      auto held = std::make_shared<transport::message>(std::move(m));
      ex_.post_compute([this, targets, held] {
        const auto w = transport::weights_of(*held->as<wire::GlobalWeights>(), runner_->model());
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
      const auto to = transport::tier_of(mg.to_role());
      if (to == core::tier::server) throw core::error("Migrate from the server addressed to the server");
      if (to == core::tier::device) return relay_down(mg.device_id(), m);
      return install(it->second.s, std::move(m));
    }
    case wire::Body::Activations:
    case wire::Body::Gradients:
      return step(transport::step_key_of(m)->device_id, std::move(m), core::tier::server);
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
    case wire::Body::Ping:
    case wire::Body::Pong:
      return;
    default:
      throw core::error("unexpected " + std::string(transport::body_name(m.type())));
  }
}

void edge_node::impl::relay_down(std::uint32_t dev, const transport::message& m) {
  const auto it = devices_.find(dev);
  if (it != devices_.end() && it->second.s) it->second.s->post(transport::copy_of(m));
}

void edge_node::impl::on_plan(const transport::message& m) {
  const auto& p = *m.as<wire::Plan>();
  const std::string json = p.model() ? p.model()->str() : "";
  const auto training = transport::training_of(p);
  batch_ = static_cast<std::uint64_t>(p.micro_batch_size()) * std::max(1u, p.n_micro_batches());
  if (json != model_json_) {
    model_ = core::parse_model_spec(json, "plan");
    model_json_ = json;
    ex_.post_compute([this, json, training, batch = p.micro_batch_size()] {
      runner_->set_model(json, training);
      runner_->profile(batch, training);
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
    const split::route r = transport::route_for(p, id, model_.n_blocks());
    ex_.post_compute([this, id, cut = transport::cut_settings_for(p, id, r)] { runner_->set_cut(id, cut); });
    auto& st = it->second;
    if (p.resplit() && st.planned) {
      st.rs.announce(r, p.epoch());
    } else {
      // Under the same run and route (the server came back) its segments keep their state.
      const bool same_run = st.planned && p.run_id() != 0 && p.run_id() == previous_run && st.rs.route == r;
      st.rs.reset(r, p.epoch());
      st.planned = true;
      ex_.post_compute([this, id, r, same_run] {
        runner_->discard(id, !same_run);
        if (same_run) return;
        started_.erase(id);
        for (int seg : r.segments_on(core::tier::edge)) runner_->host().host(id, r, seg);
      });
    }
    st.s->post(transport::copy_of(m));
  }
}

void edge_node::impl::on_round_start(const wire::RoundStart& r) {
  if (r.round() != round_ || !collecting_) {
    // A new round: the replicas of the devices here that are in it are pre-averaged.
    if (round_ > 0)
      ex_.post_compute([this] {
        if (runner_->has_model() && runner_->reprofile_if_idle()) {
          auto snap = runner_->snapshot(memory_budget_);
          ex_.post_io([this, snap = std::move(snap)]() mutable { send_profile(std::move(snap)); });
        }
      });
    round_ = r.round();
    auto open = below_->open();
    open.push_back(up_->current());
    schedule_->advance(round_, open);
    collecting_ = true;
    flushing_ = false;
    uploaded_.clear();
    arrived_.clear();
    stats_ = {};
    bytes_mark_ = below_->bytes_moved();
    for (auto& [id, d] : devices_) {
      d.expected = d.done = false;
      d.parts.clear();
    }
    if (r.devices())
      for (auto id : *r.devices())
        if (const auto it = devices_.find(id); it != devices_.end() && it->second.s) it->second.expected = true;
    patience_ = std::chrono::milliseconds(static_cast<long>(static_cast<double>(r.deadline_ms()) * 0.9));
    ex_.post_compute([this] { runner_->take_compute_seconds(); });
  }
  last_progress_ = clock::now();
  local_steps_ = r.local_steps();
  if (r.learning_rate() > 0)  // 0: the server keeps the plan's rate
    ex_.post_compute([this, id = r.device_id(), lr = r.learning_rate()] { runner_->host().set_learning_rate(id, lr); });
  if (const auto it = devices_.find(r.device_id()); it != devices_.end() && it->second.planned)
    ex_.post_compute(
        [this, id = r.device_id(), round = r.round(), route = it->second.rs.route] {
          auto& st = started_[id];
          if (st.round == round && st.route == route)
            runner_->restore_optimizer(id, route, st.optimizer);
          else
            st = round_start{round, route, runner_->optimizer_states(id, route)};
        },
        [this, id = r.device_id()](const std::string& why) {
          spdlog::warn("edge {}: device {}: the state its round started from is not restored: {}", c_.id, id, why);
        });
  const auto it = devices_.find(r.device_id());
  if (it != devices_.end() && it->second.s) {
    transport::round_start_desc rs{r.round(),     r.epoch(), r.local_steps(), r.deadline_ms(), r.learning_rate(),
                                   r.device_id(), {}};
    it->second.s->post(transport::make_round_start(rs));
  }
  // Flush at the latest when nothing has progressed for 90% of the server's deadline.
  flush_timer_.expires_after(patience_);
  flush_timer_.async_wait([this, round = round_](std::error_code ec) {
    if (!ec && collecting_ && round_ == round && clock::now() - last_progress_ >= patience_) maybe_flush(true);
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
  d.planned = d.expected = d.done = false;
  d.parts.clear();
  uploaded_.forget(s->id);
  d.hello.assign(hello.frame().begin(), hello.frame().end());
  spdlog::info("edge {}: device {} ({}) connected", c_.id, s->id, s->identity);
  schedule_->apply(*s);
  up_->post(transport::copy_of(hello));
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
  up_->post(transport::make_leave({s->id, why}));
  maybe_flush(false);
}

void edge_node::impl::on_device(const runtime::session_ptr& s, transport::message m) {
  auto& d = devices_.at(s->id);
  switch (m.type()) {
    case wire::Body::Activations:
    case wire::Body::Gradients:
      if (transport::step_key_of(m)->device_id != s->id) throw core::error("step message for another device");
      return step(s->id, std::move(m), core::tier::device);
    case wire::Body::ReplicaUpload:
      return on_replica(d, *m.as<wire::ReplicaUpload>());
    case wire::Body::Migrate: {
      const auto& mg = *m.as<wire::Migrate>();
      if (mg.device_id() != s->id || transport::tier_of(mg.from_role()) != core::tier::device)
        throw core::error("Migrate for another device");
      const auto to = transport::tier_of(mg.to_role());
      if (to == core::tier::device) throw core::error("Migrate from a device addressed to a device");
      if (to == core::tier::server) {
        up_->post(transport::copy_of(m));
        return;
      }
      return install(s, std::move(m));
    }
    case wire::Body::Cutover:
      return on_cutover(d, m);
    case wire::Body::Profile:
      if (m.as<wire::Profile>()->node_id() != s->id) throw core::error("profile of another node");
      up_->post(transport::copy_of(m));
      return;
    case wire::Body::SecAgg:
      if (m.as<wire::SecAgg>()->device_id() != s->id) throw core::error("secure aggregation message of another device");
      up_->post(transport::copy_of(m));
      return;
    default:
      throw core::error("unexpected " + std::string(transport::body_name(m.type())) + " from a device");
  }
}

void edge_node::impl::on_replica(device_state& d, const wire::ReplicaUpload& r) {
  const auto devs = transport::devices_of(r);
  const std::uint32_t id = d.s->id;
  if (devs.size() != 1 || devs[0] != id) throw core::error("a device may only upload its own replicas");
  if (!collecting_ || flushing_ || r.round() != round_ || !d.expected) return;
  const auto w = transport::replica_weights_of(r, model_);
  if (secure_) {
    // Its blocks come masked: this part is its statistics and samples only.
    if (r.first_block() != r.end_block())
      throw core::error("device " + std::to_string(id) + ": blocks [" + std::to_string(r.first_block()) + ", " +
                        std::to_string(r.end_block()) + ") uploaded in the clear under secure aggregation");
    if (r.n_samples() > local_steps_ * batch_)
      throw core::error("device " + std::to_string(id) + ": claims " + std::to_string(r.n_samples()) +
                        " samples; the round's steps allow " + std::to_string(local_steps_ * batch_));
  } else
    try {
      // The route in force now: a device that cut over during the round sent its Cutover first.
      uploaded_.check(
          devs, split::device_rights(d.rs.route, local_steps_ * batch_),
          {static_cast<int>(r.first_block()), static_cast<int>(r.end_block()), r.n_samples(), w.params, w.buffers});
    } catch (const core::error& e) {
      // Counted out of the round here: nothing of it goes up.
      d.parts.clear();
      d.done = false;
      throw core::error("device " + std::to_string(id) + ": replica of round " + std::to_string(round_) +
                        " refused: " + e.what());
    }
  if (!secure_)
    d.parts.push_back({static_cast<int>(r.first_block()),
                       static_cast<int>(r.end_block()),
                       r.n_samples(),
                       {w.params.begin(), w.params.end()},
                       {w.buffers.begin(), w.buffers.end()}});
  if (!r.final_part()) return;
  const auto s = transport::stats_of(r);
  stats_.device_compute_us += s.compute_us;
  stats_.loss_sum += s.loss_sum;
  stats_.n_loss += s.n_loss;
  stats_.n_correct += s.n_correct;
  d.done = true;
  d.n_samples = r.n_samples();
  arrived_.push_back(id);
  last_progress_ = clock::now();
  maybe_flush(false);
}

void edge_node::impl::on_cutover(device_state& d, const transport::message& m) {
  const auto& c = *m.as<wire::Cutover>();
  if (c.device_id() != d.s->id) throw core::error("Cutover of another device");
  const split::route from = d.rs.cut_over(c.epoch()), to = d.rs.route;
  const transport::migrate_desc md{d.rs.epoch, c.step(), d.s->id, c_.id, core::tier::edge, c_.id};
  auto cutover = std::make_shared<transport::message_builder>(transport::copy_of(m));
  ex_.post_compute(
      [this, s = d.s, from, to, md, cutover] {
        auto moved = runner_->rehost(s->id, from, to, md);
        runtime::count_migration(ex_.metrics(), moved);
        for (auto& [tier, msg] : moved)
          tier == core::tier::device ? s->post(std::move(msg)) : up_->post(std::move(msg));
        // After this edge's own blocks, so the server has them when it re-hosts.
        up_->post(std::move(*cutover));
      },
      [this, s = d.s](const std::string& why) { below_->close(s, why); });
}

void edge_node::impl::step(std::uint32_t dev, transport::message m, core::tier from) {
  const auto it = devices_.find(dev);
  if (it == devices_.end() || !it->second.planned || !it->second.s) return;  // gone meanwhile
  const auto& d = it->second;
  const std::uint32_t epoch = transport::step_key_of(m)->epoch;
  if (epoch != d.rs.epoch) {
    if (from == core::tier::server) throw core::error("step message of plan " + std::to_string(epoch));
    return below_->close(d.s, "step message of plan " + std::to_string(epoch) + ", now " + std::to_string(d.rs.epoch));
  }
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

void edge_node::impl::install(const runtime::session_ptr& s, transport::message m) {
  auto held = std::make_shared<transport::message>(std::move(m));
  ex_.post_compute([this, held, s] { runner_->install(s->id, *held->as<wire::Migrate>()); },
                   [this, s](const std::string& why) { below_->close(s, why); });
}

void edge_node::impl::send_profile(split::node_profile prof) {
  latest_profile_ = prof;
  for (const auto& s : below_->sessions()) prof.links.push_back(s->measured_link(s->id));
  if (const auto s = up_->current()) prof.links.push_back(s->measured_link(0));
  up_->post(transport::make_profile(prof, 0, 0));
}

void edge_node::impl::maybe_flush(bool deadline) {
  if (!collecting_ || flushing_) return;
  std::vector<std::uint32_t> done;
  for (auto& [id, d] : devices_) {
    if (!d.expected) continue;
    if (d.done)
      done.push_back(id);
    else if (d.s && !deadline)
      return;  // still training
  }
  flushing_ = true;
  ex_.spawn(flush(std::move(done), round_), "averaging a round");
}

asio::awaitable<void> edge_node::impl::flush(std::vector<std::uint32_t> done, std::uint64_t round) {
  // This edge's own replicas of the devices that finished join their uploads.
  std::vector<std::pair<std::uint32_t, split::route>> own;
  for (auto id : done) own.emplace_back(id, devices_.at(id).rs.route);
  auto take = [this, own] {
    std::pair<std::vector<std::vector<runtime::segment_runner::replica>>, double> t;
    for (const auto& [id, r] : own) t.first.push_back(runner_->replicas(id, r));
    t.second = runner_->take_compute_seconds();
    return t;
  };
  auto [mine, compute] = co_await ex_.compute(std::move(take));
  if (round != round_ || !collecting_) co_return;
  const std::uint64_t bytes = below_->bytes_moved();
  auto parts = per_device_ ? device_parts(done, mine) : pre_average(done, mine);
  // An empty final part carries the statistics when nothing was averaged.
  if (parts.empty()) parts.push_back({done});
  parts.back().final_part = true;
  transport::replica_desc d;
  d.round = round;
  d.node_id = c_.id;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const upload_part& p = parts[i];
    d.devices = p.devices;
    d.first_block = static_cast<std::uint32_t>(p.first);
    d.end_block = static_cast<std::uint32_t>(p.end);
    d.n_samples = p.n_samples;
    d.final_part = p.final_part;
    // The statistics go with the last part only.
    if (i + 1 == parts.size()) {
      d.stats = stats_;
      d.stats.compute_us = static_cast<std::uint64_t>(compute * 1e6);
      d.stats.bytes_moved = bytes - std::min(bytes, bytes_mark_);
    }
    up_->post(transport::make_replica_upload(d, p.params, p.buffers));
  }
  collecting_ = false;
}

std::vector<edge_node::impl::upload_part> edge_node::impl::device_parts(const std::vector<std::uint32_t>& done,
                                                                        replica_sets& mine) {
  // Each device's own replicas, its upload and this edge's, each part naming that device only;
  // a device's last part is final, so the server counts it in as it comes.
  std::vector<upload_part> parts;
  for (std::size_t i = 0; i < done.size(); ++i) {
    auto& d = devices_.at(done[i]);
    const std::size_t from = parts.size();
    for (auto& h : d.parts)
      parts.push_back({{done[i]}, h.first, h.end, h.n_samples, std::move(h.params), std::move(h.buffers)});
    for (auto& rep : mine[i])
      parts.push_back({{done[i]}, rep.first, rep.end, d.n_samples, std::move(rep.params), std::move(rep.buffers)});
    if (parts.size() == from) parts.push_back({{done[i]}});
    parts.back().final_part = true;
  }
  return parts;
}

std::vector<edge_node::impl::upload_part> edge_node::impl::pre_average(const std::vector<std::uint32_t>& done,
                                                                       const replica_sets& mine) {
  // One pre-average: the devices' uploads in the order they came, then this edge's replicas.
  split::model_average avg(model_);
  const std::set<std::uint32_t> in(done.begin(), done.end());
  for (auto id : arrived_)
    if (in.count(id))
      for (const auto& h : devices_.at(id).parts)
        if (h.n_samples > 0) avg.add(h.first, h.end, static_cast<double>(h.n_samples), h.params, h.buffers);
  for (std::size_t i = 0; i < done.size(); ++i)
    for (const auto& rep : mine[i])
      avg.add(rep.first, rep.end, static_cast<double>(devices_.at(done[i]).n_samples), rep.params, rep.buffers);
  // One part per run of blocks with one weight.
  std::vector<upload_part> parts;
  for (const auto& run : avg.runs()) {
    upload_part& p = parts.emplace_back(upload_part{done, run.first, run.end, static_cast<std::uint64_t>(run.weight)});
    avg.mean(run.first, run.end, p.params, p.buffers);
  }
  return parts;
}

void edge_node::impl::on_upstream_connected(const runtime::session_ptr& s) {
  transport::hello_info h;
  h.role = core::tier::edge;
  h.node_id = c_.id;
  h.name = c_.name;
  s->post(transport::make_hello(h));
  if (latest_profile_) send_profile(*latest_profile_);
  schedule_->apply(*s);
  // Devices already here are announced again (the server may have restarted).
  for (auto& [id, d] : devices_)
    if (d.s) s->post(transport::message_builder::from_frame(d.hello));
}

int edge_node::impl::run() {
  schedule_.emplace(ex_, c_.schedule, c_.name);  // configuration errors first
  tls_.emplace(transport::tls_files_in(c_.certs, c_.name));
  be_ = backend::make_backend(c_.backend);
  memory_budget_ = c_.memory_budget ? c_.memory_budget : split::default_memory_budget();
  runner_.emplace(*be_, core::tier::edge, c_.id);
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
  if (!c_.metrics.empty()) ex_.serve_metrics(c_.metrics);
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
