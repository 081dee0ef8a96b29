// The round's view of the server: its members from membership, its compute on the segment runner
// and the evaluating trainer, and a closed round handed to the publisher, every holder of the
// global model and the checkpoint store; and the server's side of rounds and plans (a round's
// learning rate, re-planning, its own profile).
#include <spdlog/spdlog.h>

#include "server_impl.h"

namespace cleave::server {

std::vector<round_host::member> server_node::impl::wiring::connected() const {
  std::vector<member> out;
  for (const auto& [id, d] : s_.members_.all())
    if (d.connected) out.push_back({id, d.rs.route, d.via.get()});
  return out;
}

bool server_node::impl::wiring::attached(std::uint32_t id, const void* via) const {
  const auto* d = s_.members_.find(id);
  return d && d->connected && (!via || d->via.get() == via);
}

const split::route& server_node::impl::wiring::route_of(std::uint32_t id) const {
  return s_.members_.find(id)->rs.route;
}

std::uint32_t server_node::impl::wiring::plan_epoch() const {
  return s_.plans_.epoch();
}

void server_node::impl::wiring::post(std::uint32_t id, transport::message_builder m) {
  if (const auto* d = s_.members_.find(id); d && d->connected) d->via->post(std::move(m));
}

void server_node::impl::wiring::opening(std::uint64_t number) {
  runtime::advance_schedule(*s_.schedule_, number, s_.acceptor_->open(), s_.ex_, s_.runner_);
  if (number > 1 && s_.plans_.book())
    s_.ex_.post_compute([this] {
      if (s_.runner_->reprofile_if_idle()) s_.publish_profile();
    });
  s_.plans_.release_deferred();
  s_.replan("round " + std::to_string(number));
  for (auto& [id, d] : s_.members_.all()) d.legs.clear();
}

std::function<void()> server_node::impl::wiring::installer(const device_routes& routes, float lr,
                                                           const global_model& g) {
  // After a resume, a replica starts from the optimizer state it had.
  optimizer_states resumed;
  for (const auto& [id, r] : routes) {
    if (auto node = s_.resumed_opt_.extract(id)) resumed.insert(std::move(node));
    s_.plans_.round_opened(id);
  }
  return [this, routes, lr, g = &g, resumed = std::move(resumed)] {
    auto& runner = *s_.runner_;
    runner.take_compute_seconds();
    for (const auto& [id, r] : routes) {
      runner.load(id, r, g->params, g->buffers, s_.c_.mode == training_mode::sequential);
      runner.host().set_learning_rate(id, lr);
      if (const auto it = resumed.find(id); it != resumed.end()) try {
          runner.restore_optimizer(id, r, it->second);
        } catch (const core::error& e) {
          spdlog::warn("server: device {}: its optimizer state from the checkpoint is not restored: {}", id, e.what());
        }
    }
  };
}

void server_node::impl::wiring::gather(const device_routes& routes, const std::set<std::uint32_t>& in,
                                       split::aggregator& avg) {
  std::set<std::pair<int, int>> seen;
  const auto& c = s_.c_;
  const bool shared = c.mode == training_mode::sequential;
  const double w = static_cast<double>(c.local_steps) * c.batch * (shared ? static_cast<double>(in.size()) : 1.0);
  for (const auto& [id, r] : routes) {
    if (in.count(id))
      for (const auto& rep : s_.runner_->replicas(id, r, shared ? &seen : nullptr))
        avg.add(rep.first, rep.end, w, rep.params, rep.buffers);
    s_.runner_->discard(id);
  }
}

void server_node::impl::wiring::discard(const device_routes& routes) {
  for (const auto& [id, r] : routes) s_.runner_->discard(id);
}

evaluation server_node::impl::wiring::evaluate(const global_model& g, bool evaluate, bool whole) {
  core::stage& es = s_.eval_->model_stage();
  s_.be_->upload(es.params(), g.params.data());
  if (!g.buffers.empty()) s_.be_->upload(es.buffers(), g.buffers.data());
  evaluation ev;
  ev.compute_s = s_.runner_->take_compute_seconds();
  const core::data_source& test = whole || !s_.eval_subset_ ? *s_.test_ : *s_.eval_subset_;
  if (evaluate) {
    ev.report = s_.eval_->evaluate(test);
    ev.test_samples = test.size();
  }
  return ev;
}

std::uint64_t server_node::impl::wiring::bytes_moved() const {
  return s_.acceptor_->bytes_moved();
}

double server_node::impl::wiring::predicted_step(const std::set<std::uint32_t>& in,
                                                 std::vector<round_report::leg>* legs) {
  return s_.plans_.predicted_step(in, legs);
}

asio::awaitable<void> server_node::impl::wiring::closed(const round_report& rep, const device_routes& routes) {
  s_.publisher_.observe(rep);
  if (s_.c_.on_round) s_.c_.on_round(rep);
  // Broadcast to every holder, then the checkpoint.
  for (const auto& s : s_.acceptor_->sessions()) {
    const auto* d = s_.members_.find(s->id);
    if (s->role == core::tier::edge || (d && d->via == s)) s_.send_global(s, 0);
  }
  if (s_.c_.checkpoint.empty()) co_return;
  auto meta = s_.plans_.state(routes);
  meta["run_id"] = std::to_string(s_.run_id_);
  meta["test_accuracy"] = std::to_string(rep.test_accuracy);
  meta["test_loss"] = std::to_string(rep.test_loss);
  meta.merge(s_.test_->input_normalisation());  // for the model exported from it
  // Named, not a temporary in the co_await expression (g++ 12 destroys those twice).
  auto save = [this, r = rep.round, routes, meta = std::move(meta)] {
    core::checkpoint ck =
        core::capture(s_.eval_->model_stage(), s_.eval_->opt(), s_.c_.seed, static_cast<std::int64_t>(r));
    optimizer_states opt;
    for (const auto& [id, route] : routes) opt[id] = s_.runner_->optimizer_states(id, route);
    return s_.store_.save(std::move(ck), r, opt, meta);
  };
  if (const std::string why = co_await s_.ex_.compute(std::move(save)); !why.empty()) {
    spdlog::error("server: round {}: checkpoint not written, the previous one is kept: {}", rep.round, why);
    s_.ex_.metrics().add("cleave_checkpoint_failures_total", {});
    s_.checkpoint_failure_ = "round " + std::to_string(rep.round) + ": " + why;
  }
}

void server_node::impl::replan(const std::string& why) {
  round_.planner_ran(plans_.maybe_replan(why, acceptor_->sessions()));
}

void server_node::impl::publish_profile() {
  ex_.post_io(
      [this, snap = runner_->snapshot(memory_budget_)]() mutable { plans_.set_server_profile(std::move(snap)); });
}

float server_node::impl::round_lr(std::uint64_t r) const {
  core::optimizer_config s = c_.opt;
  s.schedule = c_.lr_schedule;
  s.total_steps = c_.rounds;
  s.step_size = std::max(1, c_.rounds / 3);
  s.warmup_steps = c_.warmup_rounds;
  return core::learning_rate(s, static_cast<std::int64_t>(r) - 1);
}

}  // namespace cleave::server
