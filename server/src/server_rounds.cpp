// The server's round as a state machine: open -> wait for members -> start -> collect -> close
// and average -> evaluate -> broadcast -> checkpoint.
#include <algorithm>

#include "server_impl.h"

namespace cleave::server {

float server_node::impl::round_lr(std::uint64_t r) const {
  core::optimizer_config s = c_.opt;
  s.schedule = c_.lr_schedule;
  s.total_steps = c_.rounds;
  s.step_size = std::max(1, c_.rounds / 3);
  s.warmup_steps = c_.warmup_rounds;
  return core::learning_rate(s, static_cast<std::int64_t>(r) - 1);
}

asio::awaitable<bool> server_node::impl::wait_for_members() {
  const auto enough = [this] { return n_connected() >= c_.min_devices; };
  if (enough()) co_return true;
  round_.at = phase::waiting;
  const auto patience = std::chrono::milliseconds(static_cast<long>(c_.join_timeout_s * 1000));
  spdlog::info("server: waiting for {} device{} ({} connected)", c_.min_devices, c_.min_devices == 1 ? "" : "s",
               n_connected());
  for (auto deadline = clock::now() + patience; !ex_.stopping(); deadline += patience) {
    if (co_await wake_.wait_until(enough, deadline)) co_return true;
    if (ex_.stopping()) break;
    const std::string what =
        fmt::format("{} of {} devices connected after {:.0f} s", n_connected(), c_.min_devices, c_.join_timeout_s);
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
    return c_.stop_at_accuracy > 0 && last_.round > 0 && last_.evaluated &&
           last_.test_accuracy >= c_.stop_at_accuracy && last_.round < static_cast<std::uint64_t>(c_.rounds);
  };
  for (std::uint64_t next = first_round_;
       !reached() && next <= static_cast<std::uint64_t>(c_.rounds) && !ex_.stopping();) {
    if (!co_await wait_for_members()) co_return;
    if (co_await run_round(next)) ++next;
  }
  if (ex_.stopping()) co_return;
  if (reached())
    ex_.stop(fmt::format("training finished after {} of {} rounds: test accuracy {:.4f} reached {:.4f}", last_.round,
                         c_.rounds, last_.test_accuracy, c_.stop_at_accuracy));
  else
    ex_.stop(fmt::format("training finished after {} rounds: test accuracy {:.4f}", c_.rounds, last_.test_accuracy));
}

asio::awaitable<void> server_node::impl::open_round(std::uint64_t number) {
  const std::uint32_t attempt = round_.number == number ? round_.attempt + 1 : 1;
  round_ = round_state{};
  round_.number = number;
  round_.attempt = attempt;
  round_.t0 = clock::now();
  schedule_->advance(number, acceptor_->open(), ex_, runner_);
  round_.avg = std::make_unique<split::aggregator>(model_, c_.aggregate, global_p_, global_b_);
  if (number > 1 && book_)
    ex_.post_compute([this] {
      if (runner_->reprofile_if_idle()) publish_profile();
    });
  maybe_replan("round " + std::to_string(number));
  round_.bytes0 = acceptor_->bytes_moved();
  round_.lr = round_lr(number);
  std::vector<runtime::session_ptr> via;
  for (auto& [id, d] : devices_) {
    d.legs.clear();
    if (d.connected) {
      round_.routes.emplace_back(id, d.rs.route);
      via.push_back(d.via);
    }
  }
  // Every server replica starts the round from the global weights (and, after a resume, from
  // the optimizer state it had).
  decltype(resumed_opt_) resumed;
  for (const auto& [id, r] : round_.routes) {
    if (auto node = resumed_opt_.extract(id)) resumed.insert(std::move(node));
    resumed_routes_.erase(id);
  }
  auto install = [this, routes = round_.routes, lr = round_.lr, p = global_p_, b = global_b_, resumed] {
    runner_->take_compute_seconds();
    for (const auto& [id, r] : routes) {
      runner_->load(id, r, p, b, c_.mode == training_mode::sequential);
      runner_->host().set_learning_rate(id, lr);
      if (const auto it = resumed.find(id); it != resumed.end()) try {
          runner_->restore_optimizer(id, r, it->second);
        } catch (const core::error& e) {
          spdlog::warn("server: device {}: its optimizer state from the checkpoint is not restored: {}", id, e.what());
        }
    }
    return 0;
  };
  co_await ex_.compute(std::move(install));
  // Devices that left (or came back on a new connection) while the replicas were installed are
  // not in this round: it would wait for them until its deadline.
  for (std::size_t i = 0; i < round_.routes.size(); ++i) {
    const std::uint32_t id = round_.routes[i].first;
    const auto& d = devices_.at(id);
    if (d.connected && d.via == via[i]) round_.participants.push_back(id);
  }
  round_.members.insert(round_.participants.begin(), round_.participants.end());
}

void server_node::impl::start_training(std::uint32_t id, clock::time_point until) {
  // In sequential mode a device's turn waits for it alone.
  const bool turn = c_.mode == training_mode::sequential;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now()).count();
  protocol::round_start_desc rs{round_.number,
                                plan_epoch_,
                                static_cast<std::uint32_t>(c_.local_steps),
                                static_cast<std::uint64_t>(std::max<std::int64_t>(left, 1)),
                                round_.lr,
                                id,
                                turn ? std::span<const std::uint32_t>(&id, 1) : round_.participants,
                                round_.attempt};
  devices_.at(id).via->post(protocol::make_round_start(rs));
}

asio::awaitable<void> server_node::impl::take_turns(clock::time_point deadline) {
  const std::vector<std::uint32_t> order = round_.participants;
  const auto member = [this](std::uint32_t d) { return round_.members.count(d) > 0; };
  for (auto at = order.begin(); at != order.end(); ++at) {
    const std::uint32_t id = *at;
    if (!member(id)) continue;
    // An equal share of what is left for the turns to come: one that ends early leaves its time
    // to the others, one that stalls costs its own share only.
    const auto turns = std::count_if(at, order.end(), member);
    const auto share = (deadline - clock::now()) / turns;
    const auto until = clock::now() + share;
    start_training(id, until);
    const auto over = [this, id, &member] { return round_.done.count(id) > 0 || !member(id); };
    co_await wake_.wait_until(over, until);
    if (round_.done.count(id) || !round_.members.erase(id)) continue;
    ++round_.overran;
    spdlog::warn("server: round {}: device {} did not finish its turn of {:.1f} s; counted out, the next turn starts",
                 round_.number, id, std::chrono::duration<double>(share).count());
  }
}

// One round; false when nobody finished it (it is run again, not counted as training).
asio::awaitable<bool> server_node::impl::run_round(std::uint64_t number) {
  co_await open_round(number);
  round_.at = phase::collecting;
  const auto& participants = round_.participants;
  if (c_.on_round_start) c_.on_round_start(number, static_cast<int>(participants.size()));
  const auto deadline = clock::now() + std::chrono::milliseconds(static_cast<long>(c_.round_deadline_s * 1000));
  // A round waits for its members only: a device that leaves or comes back is counted out.
  const auto all_done = [this] {
    return std::includes(round_.done.begin(), round_.done.end(), round_.members.begin(), round_.members.end());
  };
  if (c_.mode == training_mode::splitfed) {
    for (auto id : participants) start_training(id, deadline);
    if (c_.secure_aggregation) co_await secure_roster(deadline);
  } else {
    co_await take_turns(deadline);
  }
  co_await wake_.wait_until(all_done, deadline);
  round_.at = phase::closing;
  round_.train_seconds = std::chrono::duration<double>(clock::now() - round_.t0).count();
  const std::size_t n_in = round_.done.size();
  if (n_in < participants.size())
    spdlog::warn("server: round {}: {} of {} devices finished {}{}", number, n_in, participants.size(),
                 !all_done()          ? fmt::format("within the {:g} s deadline", c_.round_deadline_s)
                 : round_.overran > 0 ? "(the others left or overran their turns)"
                                      : "(the others left)",
                 n_in > 0     ? "; averaging those"
                 : all_done() ? "; nobody trained: the round runs again"
                              : "; nobody trained: the round runs again (slow devices? raise --deadline)");
  if (n_in == 0) {
    abandon_round();
    co_return false;
  }
  futile_rounds_ = 0;
  if (c_.secure_aggregation) co_await secure_aggregate();
  co_await close_round();
  co_return true;
}

void server_node::impl::abandon_round() {
  ex_.post_compute([this, routes = round_.routes] {
    for (const auto& [id, r] : routes) runner_->discard(id);
  });
  // Running it again from the same weights can only end the same way when every upload was
  // refused (a model that diverged to NaN on every device, or only hostile ones).
  futile_rounds_ = round_.refused.empty() ? 0 : futile_rounds_ + 1;
  if (futile_rounds_ >= max_futile_rounds)
    ex_.fail(std::make_exception_ptr(
                 core::error("round " + std::to_string(round_.number) + ": every upload was refused in " +
                             std::to_string(futile_rounds_) + " attempts in a row (last: " + round_.refused +
                             "); stopping rather than repeating it (a diverged model? check --lr)")),
             "running rounds");
}

asio::awaitable<void> server_node::impl::close_round() {
  const std::set<std::uint32_t> in = round_.done;
  auto routes = round_.routes;
  for (auto& [id, r] : routes) r = devices_.at(id).rs.route;  // re-splits during the round
  // Close and average (server replicas of the finished devices + uploads), then evaluate.
  struct averaged {
    std::vector<float> params, buffers;
    core::eval_report eval;
    double compute = 0;
    std::int64_t test_samples = 0;  // 0: not evaluated this round
  };
  const bool last = round_.number == static_cast<std::uint64_t>(c_.rounds);
  const bool evaluate = last || round_.number % static_cast<std::uint64_t>(c_.eval_every) == 0;
  const core::data_source* test = last || !eval_subset_ ? test_.get() : eval_subset_.get();
  auto average = [this, routes, in, avg = round_.avg.get(), p = global_p_, b = global_b_, evaluate, test]() mutable {
    std::set<std::pair<int, int>> seen;
    const bool shared = c_.mode == training_mode::sequential;
    const double w = static_cast<double>(c_.local_steps) * c_.batch * (shared ? static_cast<double>(in.size()) : 1.0);
    for (const auto& [id, r] : routes) {
      if (in.count(id))
        for (const auto& rep : runner_->replicas(id, r, shared ? &seen : nullptr))
          avg->add(rep.first, rep.end, w, rep.params, rep.buffers);
      runner_->discard(id);
    }
    avg->result_into(p, b);
    core::stage& es = eval_->model_stage();
    be_->upload(es.params(), p.data());
    if (!b.empty()) be_->upload(es.buffers(), b.data());
    const double secs = runner_->take_compute_seconds();
    return averaged{std::move(p), std::move(b), evaluate ? eval_->evaluate(*test) : core::eval_report{}, secs,
                    evaluate ? test->size() : 0};
  };
  auto result = co_await ex_.compute(std::move(average));
  global_p_ = std::move(result.params);
  global_b_ = std::move(result.buffers);
  round_.server_compute = result.compute;
  const std::uint64_t bytes = acceptor_->bytes_moved();
  round_.edge_bytes += bytes - std::min(bytes, round_.bytes0);
  report(result.eval, result.test_samples);
  // Broadcast to every holder, then the checkpoint.
  for (const auto& s : acceptor_->sessions())
    if (s->role == core::tier::edge || (devices_.count(s->id) && devices_.at(s->id).via == s)) send_global(s, 0);
  if (!c_.checkpoint.empty()) {
    // Named, not a temporary in the co_await expression (g++ 12 destroys those twice).
    auto save = [this, r = round_.number, routes, state = splitter_state(routes)] {
      return save_checkpoint(r, routes, state);
    };
    if (const std::string why = co_await ex_.compute(std::move(save)); !why.empty()) {
      spdlog::error("server: round {}: checkpoint not written, the previous one is kept: {}", round_.number, why);
      ex_.metrics().add("cleave_checkpoint_failures_total", {});
      checkpoint_failure_ = "round " + std::to_string(round_.number) + ": " + why;
    }
  }
  round_.at = phase::idle;
}

namespace {

// "1-4,7,9-12" of sorted ids.
std::string id_ranges(const std::vector<std::uint32_t>& ids) {
  std::string out;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(ids[i]) + (j > i ? "-" + std::to_string(ids[j]) : "");
    i = j + 1;
  }
  return out;
}

}  // namespace

void server_node::impl::report(const core::eval_report& ev, std::int64_t test_samples) {
  round_report rep;
  rep.round = round_.number;
  rep.n_devices = static_cast<int>(round_.done.size());
  rep.n_participants = static_cast<int>(round_.participants.size());
  rep.seconds = std::chrono::duration<double>(clock::now() - round_.t0).count();
  rep.train_seconds = round_.train_seconds;
  rep.train_loss = round_.n_loss ? round_.loss_sum / static_cast<double>(round_.n_loss) : 0.0;
  rep.train_accuracy = round_.n_loss ? static_cast<double>(round_.n_correct) / static_cast<double>(round_.n_loss) : 0.0;
  rep.evaluated = test_samples > 0;
  rep.test_loss = rep.evaluated ? ev.loss : last_.test_loss;
  rep.test_accuracy = rep.evaluated ? ev.accuracy : last_.test_accuracy;
  rep.test_samples = rep.evaluated ? test_samples : last_.test_samples;
  rep.device_compute_s = round_.device_compute;
  rep.edge_compute_s = round_.edge_compute;
  rep.server_compute_s = round_.server_compute;
  rep.bytes_moved = round_.edge_bytes;
  rep.step_seconds = round_.train_seconds / c_.local_steps;
  rep.predicted_step_seconds = predicted_step(round_.done);
  rep.learning_rate = round_.lr;
  rep.n_resplits = round_.n_resplits;
  rep.secure_devices = round_.secure.n_aggregated;
  rep.planner_seconds = round_.planner_s;
  for (const auto& [id, d] : devices_)
    if (d.connected && round_.done.count(id)) rep.routes.emplace_back(id, d.rs.route.str());
  last_ = rep;
  const bool scheduled = c_.lr_schedule != core::schedule_kind::constant || c_.warmup_rounds > 0;
  std::string test = "test not evaluated";
  if (rep.evaluated)
    test = fmt::format("test loss {:.4f} acc {:.4f}{}", rep.test_loss, rep.test_accuracy,
                       rep.test_samples < test_->size() ? fmt::format(" ({} samples)", rep.test_samples) : "");
  spdlog::info(
      "round {}/{}: {}/{} devices, train loss {:.4f} acc {:.4f}, {}; compute device {:.1f} s, edge {:.1f} s, server "
      "{:.1f} s; {:.1f} MB moved; {:.1f} s{}",
      rep.round, c_.rounds, rep.n_devices, rep.n_participants, rep.train_loss, rep.train_accuracy, test,
      rep.device_compute_s, rep.edge_compute_s, rep.server_compute_s, rep.bytes_moved / 1e6, rep.seconds,
      scheduled ? fmt::format("; lr {:.4g}", rep.learning_rate) : std::string());
  if (rep.predicted_step_seconds > 0)
    spdlog::info("round {}: step {:.1f} ms, predicted {:.1f} ms ({:+.0f}%), {} re-split{}", rep.round,
                 rep.step_seconds * 1e3, rep.predicted_step_seconds * 1e3,
                 (rep.predicted_step_seconds / rep.step_seconds - 1.0) * 100.0, rep.n_resplits,
                 rep.n_resplits == 1 ? "" : "s");
  // One line per route, naming its devices (runs of ids as ranges).
  std::map<std::string, std::vector<std::uint32_t>> by_route;
  for (const auto& [id, route] : rep.routes) by_route[route].push_back(id);
  for (const auto& [route, ids] : by_route)
    spdlog::info("round {}: device{} {}: {}", rep.round, ids.size() == 1 ? "" : "s", id_ranges(ids), route);
  observe_round(rep);
  if (c_.on_round) c_.on_round(rep);
}

}  // namespace cleave::server
