// The edge node: devices below, the server above. The I/O thread relays and keeps the books;
// one worker thread runs the edge segments.
#include "cleave/server/edge_node.h"

#include <spdlog/spdlog.h>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "cleave/backend/registry.h"
#include "cleave/core/aggregate.h"
#include "cleave/core/pipeline.h"
#include "cleave/core/profiler.h"
#include "cleave/core/random.h"
#include "cleave/transport/connect.h"
#include "cleave/transport/emulation.h"
#include "cleave/transport/listener.h"
#include "cleave/transport/outbox.h"
#include "cleave/transport/protocol.h"
#include "cleave/transport/tensor_io.h"
#include "held_steps.h"

namespace cleave::server {

namespace {
using clock = std::chrono::steady_clock;

}  // namespace

class edge_node::impl {
 public:
  explicit impl(edge_config c) : c_(std::move(c)), work_guard_(asio::make_work_guard(work_)) {}
  ~impl() {
    work_guard_.reset();
    work_.stop();
    if (worker_.joinable()) worker_.join();
  }
  int run();
  void stop() {
    asio::post(io_, [this] { finish("stopped"); });
  }
  std::atomic<std::uint16_t> port_{0};

 private:
  struct device_peer {
    std::uint32_t id = 0;
    transport::channel ch;
    std::shared_ptr<transport::outbox> out;
    bool alive = true;
    bool announced = false;
    std::vector<std::byte> hello;  // its Hello, passed on to the server (again after a reconnect)
  };
  struct device_state {
    std::shared_ptr<device_peer> peer;
    core::route route;
    std::uint32_t epoch = 0;
    std::optional<core::route> next;  // a re-split waiting for the device's Cutover
    std::uint32_t next_epoch = 0;
    bool planned = false;
    bool expected = false, done = false;
    std::uint64_t n_samples = 0;
  };

  asio::awaitable<void> upstream_loop();
  asio::awaitable<void> accept_loop();
  asio::awaitable<void> serve_device(std::shared_ptr<device_peer> d);
  void on_upstream(transport::message m);
  void on_device_message(const std::shared_ptr<device_peer>& d, transport::message m);
  void step_message(std::uint32_t dev, transport::message m, bool is_activation, bool from_server);
  void on_cutover(const std::shared_ptr<device_peer>& d, const wire::Cutover& c, const transport::message& m);
  // Installs blocks that moved here (worker), then serves the steps that waited for them.
  void install_migrated(std::uint32_t dev, core::block_state st);
  // Profiles: this edge's blocks (timed when the first plan tells the step's shape), rescaled by
  // what its segments take; sent upstream with its links' measurements.
  void profile_blocks(const wire::Plan& p);
  void send_profile(transport::node_profile prof);
  void apply_schedule(std::uint64_t round);
  void apply_caps(const std::shared_ptr<device_peer>& d);
  void drop_device(const std::shared_ptr<device_peer>& d, const std::string& why);
  void send_up(transport::message_builder&& m) {
    if (up_out_) up_out_->post(std::move(m));
  }
  void start_round(const wire::RoundStart& r);
  void maybe_flush(bool deadline);
  void finish(const std::string& why);
  // f is a named object of the caller (alive across the co_await).
  template <class F>
  asio::awaitable<std::invoke_result_t<F&>> on_worker(F& f) {
    using R = std::invoke_result_t<F&>;
    // Named, not a temporary in the co_await expression: g++ 12 destroys those twice.
    auto task = [&f]() -> asio::awaitable<R> { co_return f(); };
    co_return co_await asio::co_spawn(work_, std::move(task), asio::use_awaitable);
  }

  edge_config c_;
  asio::io_context io_, work_;
  asio::executor_work_guard<asio::io_context::executor_type> work_guard_;
  std::thread worker_;
  std::optional<transport::tls_context> tls_;
  std::optional<transport::listener> listener_;
  transport::channel up_;
  std::shared_ptr<transport::outbox> up_out_;
  bool done_ = false;

  std::unique_ptr<core::backend> be_;
  core::model_spec model_;
  std::string model_json_;
  std::unique_ptr<core::segment_host> host_;                // worker only
  held_steps held_;                                         // worker only
  core::live_profile live_;                                 // worker only
  std::map<std::uint32_t, double> step_compute_;            // worker: per device
  std::map<std::uint32_t, std::uint32_t> n_micro_batches_;  // worker: per device
  int n_observed_ = 0;                                      // worker
  int n_observed_mark_ = 0;                                 // worker: at the last round start
  int n_steps_ = 0;                                         // worker: device steps seen
  core::profile_options profile_opts_;                      // worker
  core::optimizer_config profile_opt_;                      // worker
  std::uint32_t profile_batch_ = 0;
  std::uint64_t memory_budget_ = 0;
  std::optional<transport::node_profile> latest_profile_;  // I/O thread
  transport::emulation_schedule schedule_;
  std::vector<transport::emulation_event> link_events_;  // I/O thread
  std::uint64_t schedule_round_ = 0;
  std::map<std::uint32_t, device_state> devices_;
  std::vector<std::shared_ptr<device_peer>> peers_;

  // The round being relayed.
  std::uint64_t round_ = 0;
  bool collecting_ = false, flushing_ = false;
  std::unique_ptr<core::model_average> avg_;
  clock::time_point last_progress_{};
  std::chrono::milliseconds patience_{0};
  asio::steady_timer flush_timer_{io_};
  double device_compute_s_ = 0, loss_sum_ = 0;
  std::uint64_t n_loss_ = 0, n_correct_ = 0, bytes_mark_ = 0;
  std::atomic<double> compute_s_{0};
};

edge_node::edge_node(edge_config c) : impl_(std::make_unique<impl>(std::move(c))) {}
edge_node::~edge_node() = default;
int edge_node::run() {
  return impl_->run();
}
void edge_node::stop() {
  impl_->stop();
}
std::uint16_t edge_node::port() const {
  return impl_->port_.load();
}

asio::awaitable<void> edge_node::impl::upstream_loop() {
  double backoff = 0.2;
  while (!done_) {
    transport::connect_options opts;
    if (!c_.upstream_name.empty()) opts.server_identity = c_.upstream_name;
    auto r = co_await transport::connect(*tls_, c_.upstream_host, c_.upstream_port, opts);
    if (!r) {
      spdlog::warn("edge {}: cannot reach the server at {}:{}: {}; retrying in {:.1f} s", c_.id, c_.upstream_host,
                   c_.upstream_port, r.error().reason(), backoff);
      asio::steady_timer t(io_, std::chrono::milliseconds(static_cast<int>(backoff * 1000)));
      co_await t.async_wait(asio::use_awaitable);
      backoff = std::min(c_.reconnect_max_s, backoff * 2);
      continue;
    }
    backoff = 0.2;
    up_ = std::move(r.value());
    up_out_ = std::make_shared<transport::outbox>(up_);
    spdlog::info("edge {}: connected to {} ({})", c_.id, up_.peer_identity(), up_.remote());
    transport::hello_info h;
    h.role = transport::node_role::edge;
    h.node_id = c_.id;
    h.name = c_.name;
    send_up(transport::make_hello(h));
    if (latest_profile_) send_profile(*latest_profile_);
    for (const auto& ev : link_events_)
      if (transport::name_matches(ev.b, c_.upstream_name)) up_.emulator().set(ev.caps);
    // Devices already here are announced again (the server may have restarted).
    for (auto& [id, d] : devices_)
      if (d.peer && d.peer->alive && !d.peer->hello.empty())
        send_up(transport::message_builder::from_frame(d.peer->hello));
    for (;;) {
      auto m = co_await up_.receive();
      if (!m) {
        if (!done_) spdlog::warn("edge {}: link to the server lost: {}", c_.id, m.error().reason());
        break;
      }
      try {
        on_upstream(std::move(m.value()));
      } catch (const core::error& e) {
        spdlog::error("edge {}: bad message from the server: {}", c_.id, e.what());
        up_out_->post(transport::make_error(wire::ErrorCode::bad_message, e.what()));
        break;
      }
      if (done_) co_return;
    }
    up_out_.reset();
    co_await up_.close();
    up_ = transport::channel{};
    collecting_ = false;
  }
}

void edge_node::impl::on_upstream(transport::message m) {
  switch (m.type()) {
    case wire::Body::Welcome: {
      const auto* w = m.as<wire::Welcome>();
      if (w->node_id() == c_.id) return;
      auto it = devices_.find(w->node_id());
      if (it != devices_.end() && it->second.peer)
        it->second.peer->out->post(
            transport::make_welcome({w->node_id(), w->run_id(), w->plan_epoch(), w->heartbeat_ms()}));
      return;
    }
    case wire::Body::Plan: {
      const auto& p = *m.as<wire::Plan>();
      const std::string model = p.model() ? p.model()->str() : "";
      if (model != model_json_) {
        model_ = core::parse_model_spec(model, "plan");
        model_json_ = model;
        const auto training = transport::training_of(p);
        auto fresh = std::make_shared<std::unique_ptr<core::segment_host>>(
            std::make_unique<core::segment_host>(*be_, model_, training.opt, training.seed));
        asio::post(work_, [this, fresh] { host_ = std::move(*fresh); });
        profile_blocks(p);
      }
      for (const auto* dp : *p.devices()) {
        const std::uint32_t id = dp->device_id();
        auto it = devices_.find(id);
        if (it == devices_.end() || !it->second.peer) continue;
        const core::route r = transport::route_for(p, id, model_.n_blocks());
        auto& st = it->second;
        if (p.resplit() && st.planned) {
          if (p.epoch() <= st.epoch) throw core::error("re-split of device " + std::to_string(id) + " to an old plan");
          st.next = r;
          st.next_epoch = p.epoch();
        } else {
          st.route = r;
          st.epoch = p.epoch();
          st.next.reset();
          st.planned = true;
          asio::post(work_, [this, id, r] {
            host_->drop_device(id);
            held_.forget(id);
            for (int seg : r.segments_on(core::tier::edge)) host_->host(id, r, seg);
          });
        }
        st.peer->out->post(transport::copy_of(m));
      }
      return;
    }
    case wire::Body::GlobalWeights: {
      const auto& g = *m.as<wire::GlobalWeights>();
      const auto w = transport::weights_of(g, model_);
      std::vector<float> params(w.params.begin(), w.params.end()), buffers(w.buffers.begin(), w.buffers.end());
      std::vector<std::pair<std::uint32_t, core::route>> targets;
      for (auto& [id, d] : devices_)
        if (d.planned && (g.device_id() == 0 || g.device_id() == id)) {
          targets.emplace_back(id, d.route);
          if (d.peer && d.peer->alive) d.peer->out->post(transport::copy_of(m));
        }
      asio::post(work_, [this, targets, params = std::move(params), buffers = std::move(buffers)] {
        for (const auto& [id, r] : targets)
          for (int seg : r.segments_on(core::tier::edge))
            if (host_->hosts(id, seg)) transport::install(host_->stage_of(id, seg), params, buffers);
      });
      return;
    }
    case wire::Body::RoundStart:
      apply_schedule(m.as<wire::RoundStart>()->round());
      start_round(*m.as<wire::RoundStart>());
      return;
    case wire::Body::Migrate: {
      const auto& mg = *m.as<wire::Migrate>();
      auto it = devices_.find(mg.device_id());
      if (it == devices_.end() || !it->second.planned || !it->second.peer || !it->second.peer->alive) return;
      const auto to = transport::tier_of(mg.to_role());
      if (to == core::tier::edge)
        install_migrated(mg.device_id(), transport::block_state_of(mg, model_));
      else if (to == core::tier::device)
        it->second.peer->out->post(transport::copy_of(m));
      else
        throw core::error("Migrate from the server addressed to the server");
      return;
    }
    case wire::Body::Activations:
      step_message(m.as<wire::Activations>()->device_id(), std::move(m), true, true);
      return;
    case wire::Body::Gradients:
      step_message(m.as<wire::Gradients>()->device_id(), std::move(m), false, true);
      return;
    case wire::Body::Leave: {
      // The server refused a device.
      const auto* l = m.as<wire::Leave>();
      auto it = devices_.find(l->node_id());
      if (it != devices_.end() && it->second.peer) {
        it->second.peer->out->post(
            transport::make_error(wire::ErrorCode::refused, l->reason() ? l->reason()->str() : ""));
        drop_device(it->second.peer, "refused by the server");
      }
      return;
    }
    case wire::Body::Error: {
      const auto& e = *m.as<wire::Error>();
      const std::string text = e.message() ? e.message()->str() : "";
      if (e.code() == wire::ErrorCode::shutting_down) {
        for (auto& p : peers_)
          if (p->alive) p->out->post(transport::make_error(wire::ErrorCode::shutting_down, text));
        finish(text);
        return;
      }
      spdlog::warn("edge {}: server reports: {}", c_.id, text);
      return;
    }
    case wire::Body::Ping:
    case wire::Body::Pong:
      return;
    default:
      throw core::error("unexpected " + std::string(transport::body_name(m.type())));
  }
}

void edge_node::impl::start_round(const wire::RoundStart& r) {
  if (r.round() != round_ || !collecting_) {
    if (round_ > 0)
      asio::post(work_, [this] {
        if (!live_.n_blocks()) return;
        if (n_observed_ != n_observed_mark_) {
          n_observed_mark_ = n_observed_;
          return;
        }
        // None of this edge's blocks ran last round: time them again (see the server's).
        live_ = core::live_profile(core::profile_blocks(*be_, model_, profile_opt_, profile_opts_));
        auto snap = transport::current_profile(live_, c_.id, profile_batch_, be_->name(), memory_budget_);
        asio::post(io_, [this, snap = std::move(snap)]() mutable { send_profile(std::move(snap)); });
      });
    round_ = r.round();
    collecting_ = true;
    flushing_ = false;
    avg_ = std::make_unique<core::model_average>(model_);
    device_compute_s_ = loss_sum_ = 0;
    n_loss_ = n_correct_ = 0;
    compute_s_.store(0);
    bytes_mark_ = 0;
    for (auto& p : peers_) {
      const auto s = p->ch.stats();
      bytes_mark_ += s.bytes_sent + s.bytes_received;
    }
    for (auto& [id, d] : devices_) d.expected = d.done = false;
    if (r.devices())
      for (auto id : *r.devices()) {
        auto it = devices_.find(id);
        if (it != devices_.end() && it->second.peer && it->second.peer->alive) it->second.expected = true;
      }
    patience_ = std::chrono::milliseconds(static_cast<long>(static_cast<double>(r.deadline_ms()) * 0.9));
  }
  last_progress_ = clock::now();
  if (r.learning_rate() > 0) {  // 0: the server keeps the plan's rate
    std::vector<std::uint32_t> ids;
    if (r.device_id() != 0)
      ids.push_back(r.device_id());
    else if (r.devices())
      ids.assign(r.devices()->begin(), r.devices()->end());
    asio::post(work_, [this, ids, lr = r.learning_rate()] {
      if (host_)
        for (auto id : ids) host_->set_learning_rate(id, lr);
    });
  }
  auto it = devices_.find(r.device_id());
  if (it != devices_.end() && it->second.peer && it->second.peer->alive) {
    transport::round_start_desc rs;
    rs.round = r.round();
    rs.epoch = r.epoch();
    rs.local_steps = r.local_steps();
    rs.deadline_ms = r.deadline_ms();
    rs.learning_rate = r.learning_rate();
    rs.device_id = r.device_id();
    it->second.peer->out->post(transport::make_round_start(rs));
  }
  // Flush at the latest when nothing has progressed for 90% of the server's deadline.
  flush_timer_.expires_after(patience_);
  flush_timer_.async_wait([this, round = round_](std::error_code ec) {
    if (!ec && collecting_ && round_ == round && clock::now() - last_progress_ >= patience_) maybe_flush(true);
  });
}

void edge_node::impl::maybe_flush(bool deadline) {
  if (!collecting_ || flushing_) return;
  std::vector<std::uint32_t> done;
  bool waiting = false;
  for (auto& [id, d] : devices_) {
    if (!d.expected) continue;
    if (d.done)
      done.push_back(id);
    else if (d.peer && d.peer->alive)
      waiting = true;
  }
  if (waiting && !deadline) return;
  flushing_ = true;
  std::vector<std::tuple<std::uint32_t, core::route, std::uint64_t>> routes;
  for (auto id : done) routes.emplace_back(id, devices_.at(id).route, devices_.at(id).n_samples);
  asio::co_spawn(
      io_,
      [this, routes, done, round = round_]() -> asio::awaitable<void> {
        // Add this edge's own replicas of the devices that finished.
        auto add_own = [this, routes, avg = avg_.get()] {
          for (const auto& [id, r, n_samples] : routes)
            for (int seg : r.segments_on(core::tier::edge)) {
              if (r.begin(seg) == r.end(seg) || !host_->hosts(id, seg)) continue;
              core::stage& st = host_->stage_of(id, seg);
              std::vector<float> p(static_cast<std::size_t>(st.n_params())),
                  b(static_cast<std::size_t>(st.n_buffers()));
              if (!p.empty()) be_->download(st.params(), p.data());
              if (!b.empty()) be_->download(st.buffers(), b.data());
              avg->add(r.begin(seg), r.end(seg), static_cast<double>(n_samples), p, b);
            }
          return 0;
        };
        co_await on_worker(add_own);
        if (round != round_) co_return;
        std::uint64_t bytes = 0;
        for (auto& p : peers_) {
          const auto s = p->ch.stats();
          bytes += s.bytes_sent + s.bytes_received;
        }
        const auto runs = avg_->runs();
        transport::replica_desc d;
        d.round = round;
        d.node_id = c_.id;
        d.devices = done;
        for (std::size_t i = 0; i <= runs.size(); ++i) {
          // An empty final part carries the statistics when nothing was averaged.
          if (i == runs.size() && !runs.empty()) break;
          std::vector<float> p, b;
          if (i < runs.size()) {
            avg_->mean(runs[i].first, runs[i].end, p, b);
            d.first_block = static_cast<std::uint32_t>(runs[i].first);
            d.end_block = static_cast<std::uint32_t>(runs[i].end);
            d.n_samples = static_cast<std::uint64_t>(runs[i].weight);
          } else {
            d.first_block = d.end_block = 0;
            d.n_samples = 0;
          }
          d.final_part = i + 1 >= runs.size();
          if (d.final_part) {
            d.stats.compute_us = static_cast<std::uint64_t>(compute_s_.load() * 1e6);
            d.stats.device_compute_us = static_cast<std::uint64_t>(device_compute_s_ * 1e6);
            d.stats.bytes_moved = bytes - std::min(bytes, bytes_mark_);
            d.stats.loss_sum = loss_sum_;
            d.stats.n_loss = n_loss_;
            d.stats.n_correct = n_correct_;
          }
          send_up(transport::make_replica_upload(d, p, b));
        }
        collecting_ = false;
      },
      asio::detached);
}

void edge_node::impl::step_message(std::uint32_t dev, transport::message m, bool is_activation, bool from_server) {
  auto it = devices_.find(dev);
  if (it == devices_.end() || !it->second.planned || !it->second.peer || !it->second.peer->alive) {
    spdlog::debug("edge {}: dropping a step message for absent device {}", c_.id, dev);
    return;
  }
  const core::route r = it->second.route;
  const core::tier from = from_server ? core::tier::server : core::tier::device;
  const std::uint32_t block = is_activation ? m.as<wire::Activations>()->block() : m.as<wire::Gradients>()->block();
  const std::uint32_t epoch = is_activation ? m.as<wire::Activations>()->epoch() : m.as<wire::Gradients>()->epoch();
  int seg = -1;
  for (int s : r.segments_on(core::tier::edge)) {
    const auto nb = is_activation ? r.path[static_cast<std::size_t>(s - 1)] : r.path[static_cast<std::size_t>(s + 1)];
    const auto at = static_cast<std::uint32_t>(is_activation ? r.begin(s) : r.end(s));
    if (nb == from && at == block) seg = s;
  }
  const std::uint32_t plan_epoch = it->second.epoch;
  if (seg < 0 || epoch != plan_epoch) {
    const std::string why =
        "step message for block " + std::to_string(block) + " outside the plan of device " + std::to_string(dev);
    if (from_server) throw core::error(why);
    drop_device(it->second.peer, why);
    return;
  }
  auto down = it->second.peer->out;
  auto up = up_out_;
  auto peer = it->second.peer;
  auto task = [this, dev, r, seg, is_activation, down, up, peer, plan_epoch, m = std::move(m)]() mutable {
    const auto t0 = clock::now();
    try {
      core::segment_output o;
      std::uint64_t step;
      std::uint32_t mb;
      transport::batch_info bi{};
      core::tensor labels;
      if (is_activation) {
        const auto& a = *m.as<wire::Activations>();
        step = a.step();
        mb = a.micro_batch();
        bi = transport::batch_of(a);
        n_micro_batches_[dev] = bi.n_micro_batches;
        // Labels travel with activations up to the loss, unless the route is U-shaped.
        if (r.u_shape() != (a.labels() == nullptr)) throw core::error("labels do not match the plan");
        core::tensor x = transport::to_backend(*be_, transport::view_of(*a.activation()));
        if (a.labels()) labels = transport::to_backend(*be_, transport::view_of(*a.labels()));
        o = host_->forward(dev, seg, {step, mb}, x, labels, static_cast<float>(x.shape()[0]) / bi.batch_size,
                           bi.n_micro_batches, core::hash32(static_cast<std::uint32_t>(step), mb));
      } else {
        const auto& g = *m.as<wire::Gradients>();
        step = g.step();
        mb = g.micro_batch();
        o = host_->backward(dev, seg, {step, mb}, transport::to_backend(*be_, transport::view_of(*g.gradient())));
      }
      be_->synchronize();
      step_compute_[dev] += std::chrono::duration<double>(clock::now() - t0).count();
      if (o.stepped) {
        // One whole step of this segment: the live profile learns what it costs here, in
        // micro-batches of the profiled size.
        const double mb_size = static_cast<double>(o.value.defined() && o.value.shape().rank() > 0
                                                       ? o.value.shape()[0]
                                                       : static_cast<std::int64_t>(profile_batch_));
        if (r.begin(seg) < r.end(seg) && live_.n_blocks() == model_.n_blocks() && mb_size > 0) {
          live_.observe(r.begin(seg), r.end(seg), step_compute_[dev] * profile_batch_ / mb_size,
                        static_cast<int>(std::max(1u, n_micro_batches_[dev])));
          ++n_observed_;
        }
        step_compute_[dev] = 0;
        // Profiles go up at a steady pace, also when only relaying (their links' figures count).
        if (live_.n_blocks() && ++n_steps_ % std::max(1, c_.profile_every) == 0) {
          auto snap = transport::current_profile(live_, c_.id, profile_batch_, be_->name(), memory_budget_);
          asio::post(io_, [this, snap = std::move(snap)]() mutable { send_profile(std::move(snap)); });
        }
      }
      // Where the next segment runs: up the route is toward path[seg + 1].
      if (o.dir == core::segment_output::direction::up) {
        const transport::step_key key{plan_epoch, step, mb, dev, static_cast<std::uint32_t>(r.end(seg))};
        // Labels on their way to the loss above pass through unchanged.
        auto msg = transport::make_activations(key, bi, *be_, o.value, labels.defined() ? &labels : nullptr);
        (r.path[static_cast<std::size_t>(seg + 1)] == core::tier::server ? up : down)->post(std::move(msg));
      } else if (o.dir == core::segment_output::direction::down) {
        const transport::step_key key{plan_epoch, step, mb, dev, static_cast<std::uint32_t>(r.begin(seg))};
        auto msg = transport::make_gradients(key, *be_, o.value, o.loss, o.n_correct);
        (r.path[static_cast<std::size_t>(seg - 1)] == core::tier::server ? up : down)->post(std::move(msg));
      }
    } catch (const core::error& e) {
      const std::string why = e.what();
      asio::post(io_, [this, peer, why] { drop_device(peer, why); });
    }
    compute_s_.store(compute_s_.load() + std::chrono::duration<double>(clock::now() - t0).count());
  };
  auto shared_task = std::make_shared<decltype(task)>(std::move(task));
  asio::post(work_, [this, dev, shared_task] { held_.run_or_hold(*host_, dev, [shared_task] { (*shared_task)(); }); });
}

void edge_node::impl::profile_blocks(const wire::Plan& p) {
  core::profile_options po;
  po.batch = static_cast<int>(std::max(1u, p.micro_batch_size()));
  const auto training = transport::training_of(p);
  po.seed = training.seed;
  profile_batch_ = static_cast<std::uint32_t>(po.batch);
  // On the worker (it owns the backend's compute); the result comes back here.
  asio::post(work_, [this, po, opt = training.opt] {
    const auto t0 = clock::now();
    profile_opts_ = po;
    profile_opt_ = opt;
    auto base = core::profile_blocks(*be_, model_, opt, po);
    double total = 0;
    for (const auto& b : base) total += b.forward_seconds + b.backward_seconds;
    live_ = core::live_profile(base);
    n_observed_ = n_observed_mark_ = 0;
    spdlog::info("edge {}: profiled {} blocks on {} in {:.2f} s: {:.2f} ms per micro-batch of {}", c_.id,
                 model_.n_blocks(), be_->name(), std::chrono::duration<double>(clock::now() - t0).count(), total * 1e3,
                 po.batch);
    auto snap = transport::current_profile(live_, c_.id, profile_batch_, be_->name(), memory_budget_);
    asio::post(io_, [this, snap = std::move(snap)]() mutable { send_profile(std::move(snap)); });
  });
}

void edge_node::impl::send_profile(transport::node_profile prof) {
  latest_profile_ = prof;
  for (const auto& [id, d] : devices_)
    if (d.peer && d.peer->alive) {
      const auto st = d.peer->ch.stats();
      prof.links.push_back({id, static_cast<float>(transport::link_rtt_us(st)),
                            static_cast<float>(transport::link_bytes_per_second(st))});
    }
  if (up_) {
    const auto st = up_.stats();
    prof.links.push_back(
        {0, static_cast<float>(transport::link_rtt_us(st)), static_cast<float>(transport::link_bytes_per_second(st))});
  }
  send_up(transport::make_profile(prof, 0, 0));
}

void edge_node::impl::apply_caps(const std::shared_ptr<device_peer>& d) {
  for (const auto& ev : link_events_)
    if (transport::name_matches(ev.b, d->ch.peer_identity())) d->ch.emulator().set(ev.caps);
}

void edge_node::impl::apply_schedule(std::uint64_t round) {
  if (schedule_.empty() || round <= schedule_round_) return;
  schedule_round_ = round;
  for (const auto& ev : schedule_.at(static_cast<int>(round), c_.name)) {
    if (ev.what != transport::emulation_event::kind::link) continue;
    spdlog::info("edge {}: {}", c_.id, ev.str());
    link_events_.push_back(ev);
    for (const auto& d : peers_)
      if (d->alive && transport::name_matches(ev.b, d->ch.peer_identity())) d->ch.emulator().set(ev.caps);
    if (up_ && transport::name_matches(ev.b, c_.upstream_name)) up_.emulator().set(ev.caps);
  }
}

void edge_node::impl::install_migrated(std::uint32_t dev, core::block_state st) {
  auto s = std::make_shared<core::block_state>(std::move(st));
  auto it = devices_.find(dev);
  auto peer = it != devices_.end() ? it->second.peer : nullptr;
  asio::post(work_, [this, dev, s, peer] {
    try {
      host_->install_blocks(dev, std::move(*s));
      held_.release(*host_, dev);
    } catch (const core::error& e) {
      const std::string why = e.what();
      if (peer) asio::post(io_, [this, peer, why] { drop_device(peer, why); });
    }
  });
}

void edge_node::impl::on_cutover(const std::shared_ptr<device_peer>& d, const wire::Cutover& c,
                                 const transport::message& m) {
  auto& st = devices_.at(d->id);
  if (c.device_id() != d->id || !st.next || c.epoch() != st.next_epoch)
    throw core::error("Cutover to plan " + std::to_string(c.epoch()) + ", which was not announced");
  const core::route from = st.route, to = *st.next;
  st.route = to;
  st.epoch = st.next_epoch;
  st.next.reset();
  const std::uint32_t dev = d->id, epoch = st.epoch;
  const std::uint64_t step = c.step();
  auto down = d->out;
  auto up = up_out_;
  auto cutover = std::make_shared<transport::message_builder>(transport::copy_of(m));
  asio::post(work_, [this, dev, from, to, epoch, step, down, up, d, cutover] {
    try {
      const transport::migrate_desc md{epoch, step, dev, c_.id, core::tier::edge, c_.id};
      for (const auto& bs : host_->rehost(dev, from, to, core::tier::edge)) {
        auto msg = transport::make_migrate(md, to, bs);
        if (core::tier_of_block(to, bs.begin) == core::tier::device)
          down->post(std::move(msg));
        else if (up)
          up->post(std::move(msg));
      }
      // After this edge's own blocks, so the server has them when it re-hosts.
      if (up) up->post(std::move(*cutover));
      held_.release(*host_, dev);
    } catch (const core::error& e) {
      const std::string why = e.what();
      asio::post(io_, [this, d, why] { drop_device(d, why); });
    }
  });
}

void edge_node::impl::on_device_message(const std::shared_ptr<device_peer>& d, transport::message m) {
  switch (m.type()) {
    case wire::Body::Activations:
      if (m.as<wire::Activations>()->device_id() != d->id) throw core::error("step message for another device");
      step_message(d->id, std::move(m), true, false);
      return;
    case wire::Body::Gradients:
      if (m.as<wire::Gradients>()->device_id() != d->id) throw core::error("step message for another device");
      step_message(d->id, std::move(m), false, false);
      return;
    case wire::Body::ReplicaUpload: {
      const auto& r = *m.as<wire::ReplicaUpload>();
      auto& st = devices_.at(d->id);
      const auto devs = transport::devices_of(r);
      if (devs.size() != 1 || devs[0] != d->id) throw core::error("a device may only upload its own replicas");
      if (!collecting_ || flushing_ || r.round() != round_ || !st.expected || st.done) return;
      const auto w = transport::replica_weights_of(r, model_);
      if (r.n_samples() > 0)
        avg_->add(static_cast<int>(r.first_block()), static_cast<int>(r.end_block()),
                  static_cast<double>(r.n_samples()), w.params, w.buffers);
      if (!r.final_part()) return;
      const auto s = transport::stats_of(r);
      device_compute_s_ += static_cast<double>(s.compute_us) * 1e-6;
      loss_sum_ += s.loss_sum;
      n_loss_ += s.n_loss;
      n_correct_ += s.n_correct;
      st.done = true;
      st.n_samples = r.n_samples();
      last_progress_ = clock::now();
      maybe_flush(false);
      return;
    }
    case wire::Body::Migrate: {
      const auto& mg = *m.as<wire::Migrate>();
      if (mg.device_id() != d->id || transport::tier_of(mg.from_role()) != core::tier::device)
        throw core::error("Migrate for another device");
      const auto to = transport::tier_of(mg.to_role());
      if (to == core::tier::edge)
        install_migrated(d->id, transport::block_state_of(mg, model_));
      else if (to == core::tier::server)
        send_up(transport::copy_of(m));
      else
        throw core::error("Migrate from a device addressed to a device");
      return;
    }
    case wire::Body::Cutover:
      on_cutover(d, *m.as<wire::Cutover>(), m);
      return;
    case wire::Body::Profile:
      if (m.as<wire::Profile>()->node_id() != d->id) throw core::error("profile of another node");
      send_up(transport::copy_of(m));
      return;
    case wire::Body::Ping:
    case wire::Body::Pong:
      return;
    default:
      throw core::error("unexpected " + std::string(transport::body_name(m.type())) + " from a device");
  }
}

void edge_node::impl::drop_device(const std::shared_ptr<device_peer>& d, const std::string& why) {
  if (!d->alive) return;
  d->alive = false;
  spdlog::warn("edge {}: device {} disconnected: {}", c_.id, d->id, why);
  auto it = devices_.find(d->id);
  if (it != devices_.end() && it->second.peer == d) {
    it->second.peer.reset();
    it->second.planned = false;
    const auto id = d->id;
    asio::post(work_, [this, id] {
      if (host_) host_->drop_device(id);
      held_.forget(id);
    });
    if (d->announced) send_up(transport::make_leave({id, why}));
  }
  asio::co_spawn(
      io_, [d]() -> asio::awaitable<void> { co_await d->ch.close(); }, asio::detached);
  maybe_flush(false);
}

asio::awaitable<void> edge_node::impl::serve_device(std::shared_ptr<device_peer> d) {
  auto first = co_await d->ch.receive();
  if (!first) co_return;
  const auto* h = first->as<wire::Hello>();
  if (!h || static_cast<transport::node_role>(h->role()) != transport::node_role::device ||
      h->protocol_version() != transport::protocol_version) {
    d->out->post(transport::make_error(wire::ErrorCode::bad_message, "expected a device Hello"));
    drop_device(d, "first message was not a device Hello");
    co_return;
  }
  d->id = h->node_id();
  auto& st = devices_[d->id];
  if (st.peer && st.peer->alive) {
    d->out->post(transport::make_error(wire::ErrorCode::refused, "device id already connected here"));
    d->alive = false;
    co_await d->ch.close();
    co_return;
  }
  st.peer = d;
  st.planned = false;
  d->announced = true;
  spdlog::info("edge {}: device {} ({}) connected", c_.id, d->id, d->ch.peer_identity());
  apply_caps(d);
  d->hello.assign(first->frame().begin(), first->frame().end());
  send_up(transport::copy_of(*first));
  for (;;) {
    auto m = co_await d->ch.receive();
    if (!m) {
      drop_device(d, m.error().reason());
      co_return;
    }
    if (!d->alive) co_return;
    try {
      on_device_message(d, std::move(m.value()));
    } catch (const core::error& e) {
      d->out->post(transport::make_error(wire::ErrorCode::bad_message, e.what()));
      drop_device(d, e.what());
      co_return;
    }
  }
}

asio::awaitable<void> edge_node::impl::accept_loop() {
  while (!done_) {
    auto r = co_await listener_->accept();
    if (!r) co_return;
    auto d = std::make_shared<device_peer>();
    d->ch = std::move(r.value());
    d->out = std::make_shared<transport::outbox>(d->ch);
    peers_.push_back(d);
    asio::co_spawn(io_, serve_device(d), asio::detached);
  }
}

void edge_node::impl::finish(const std::string& why) {
  if (done_) return;
  done_ = true;
  spdlog::info("edge {}: {}", c_.id, why.empty() ? "done" : why);
  if (listener_) listener_->close();
  flush_timer_.cancel();
  asio::co_spawn(
      io_,
      [this]() -> asio::awaitable<void> {
        for (auto& p : peers_)
          if (p->alive) {
            p->alive = false;
            co_await p->ch.close();
          }
        if (up_) co_await up_.close();
        io_.stop();
      },
      asio::detached);
}

int edge_node::impl::run() {
  schedule_ = transport::parse_schedule(c_.schedule);  // configuration errors first
  tls_.emplace(transport::tls_files_in(c_.certs, c_.name));
  be_ = backend::make_backend(c_.backend);
  memory_budget_ = c_.memory_budget ? c_.memory_budget : core::default_memory_budget();
  transport::listener_options lo;
  lo.allowed_identities = c_.allowed;
  listener_.emplace(io_.get_executor(), *tls_, asio::ip::tcp::endpoint(asio::ip::make_address(c_.listen_host), c_.port),
                    lo);
  port_.store(listener_->port());
  spdlog::info("edge {} ({}): backend {} ({}); devices connect to {}:{}; server at {}:{}", c_.id, c_.name, be_->name(),
               be_->device_name(), c_.listen_host, listener_->port(), c_.upstream_host, c_.upstream_port);
  worker_ = std::thread([this] { work_.run(); });
  asio::co_spawn(io_, upstream_loop(), asio::detached);
  asio::co_spawn(io_, accept_loop(), asio::detached);
  io_.run();
  work_guard_.reset();
  worker_.join();
  return 0;
}

}  // namespace cleave::server
