// The server's round as a state machine: open -> start -> collect and validate -> aggregate
// (plain, robust or secure) -> evaluate -> report -> hand over (broadcast, checkpoint).
#include "round.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace cleave::server {

std::string_view mode_name(training_mode m) {
  return m == training_mode::splitfed ? "splitfed" : "sequential";
}

std::string_view phase_name(round_phase p) {
  switch (p) {
    case round_phase::idle:
      return "idle";
    case round_phase::waiting:
      return "waiting for devices";
    case round_phase::collecting:
      return "training";
    case round_phase::closing:
      return "averaging";
  }
  return "?";
}

round::round(const server_config& c, const core::model_spec& m, round_host& h, runtime::executors& ex,
             runtime::signal& wake)
    : c_(c),
      model_(m),
      layout_(core::layout_of(m)),
      host_(h),
      ex_(ex),
      wake_(wake),
      secure_(h, ex, wake, m, c.secagg_min_holders) {}

asio::awaitable<void> round::open(std::uint64_t number, float lr, const global_model& g) {
  attempt_ = number_ == number ? attempt_ + 1 : 1;
  number_ = number;
  t0_ = clock::now();
  paces_.clear();
  lr_ = lr;
  routes_.clear();
  participants_.clear();
  members_.clear();
  train_seconds_ = server_compute_ = planner_s_ = 0;
  n_resplits_ = overran_ = 0;
  refused_.clear();
  // A device training alone shows its work by a replica unlike g.
  const auto unchanged = [this, &g](int first, int end, std::span<const float> params) {
    const auto from = g.params.begin() + layout_.param_offset[static_cast<std::size_t>(first)];
    const auto to = g.params.begin() + layout_.param_offset[static_cast<std::size_t>(end)];
    return std::equal(from, to, params.begin(), params.end());
  };
  uploads_ =
      runtime::upload_collector({static_cast<std::uint64_t>(c_.local_steps) * static_cast<std::uint64_t>(c_.batch),
                                 c_.secure_aggregation, c_.aggregate.per_device(), unchanged});
  secure_.reset(number);
  avg_ = std::make_unique<split::aggregator>(model_, c_.aggregate, g.params, g.buffers);
  host_.opening(number);
  bytes0_ = host_.bytes_moved();
  const auto now = host_.connected();
  for (const auto& m : now) routes_.emplace_back(m.id, m.route);
  // Every server replica starts the round from the global weights.
  auto install = [task = host_.installer(routes_, lr, g)] {
    task();
    return 0;
  };
  co_await ex_.compute(std::move(install));
  // Devices that left (or came back on a new connection) while the replicas were installed are
  // not in this round: it would wait for them until its deadline.
  for (const auto& m : now)
    if (host_.attached(m.id, m.via)) participants_.push_back(m.id);
  members_.insert(participants_.begin(), participants_.end());
}

void round::start_training(std::uint32_t id, clock::time_point until) {
  // In sequential mode a device's turn waits for it alone.
  const bool turn = c_.mode == training_mode::sequential;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now()).count();
  protocol::round_start_desc rs{number_,
                                host_.plan_epoch(),
                                static_cast<std::uint32_t>(c_.local_steps),
                                static_cast<std::uint64_t>(std::max<std::int64_t>(left, 1)),
                                lr_,
                                id,
                                turn ? std::span<const std::uint32_t>(&id, 1) : participants_,
                                attempt_};
  host_.post(id, protocol::make_round_start(rs));
}

asio::awaitable<void> round::take_turns(clock::time_point deadline) {
  const std::vector<std::uint32_t> order = participants_;
  const auto is_member = [this](std::uint32_t d) { return members_.count(d) > 0; };
  for (auto at = order.begin(); at != order.end(); ++at) {
    const std::uint32_t id = *at;
    if (!is_member(id)) continue;
    // An equal share of what is left for the turns to come: one that ends early leaves its time
    // to the others, one that stalls costs its own share only.
    const auto turns = std::count_if(at, order.end(), is_member);
    const auto share = (deadline - clock::now()) / turns;
    const auto until = clock::now() + share;
    start_training(id, until);
    const auto over = [this, id, &is_member] { return uploads_.is_done(id) || !is_member(id); };
    co_await wake_.wait_until(over, until);
    if (uploads_.is_done(id) || !members_.erase(id)) continue;
    ++overran_;
    spdlog::warn("server: round {}: device {} did not finish its turn of {:.1f} s; counted out, the next turn starts",
                 number_, id, std::chrono::duration<double>(share).count());
  }
}

asio::awaitable<void> round::collect(clock::time_point deadline, clock::duration silence,
                                     const std::function<bool()>& all_done) {
  while (!all_done() && clock::now() < deadline) {
    // Until the earliest moment a member still training may be counted out as silent.
    auto next = deadline;
    for (auto id : members_)
      if (!uploads_.is_done(id)) next = std::min(next, heard_[id] + silence);
    co_await wake_.wait_until(all_done, next);
    const auto now = clock::now();
    if (now >= deadline) break;
    for (auto it = members_.begin(); it != members_.end();) {
      const std::uint32_t id = *it;
      if (uploads_.is_done(id) || now - heard_[id] < silence) {
        ++it;
        continue;
      }
      it = members_.erase(it);
      ++overran_;
      spdlog::warn(
          "server: round {}: nothing of device {}'s work for {:.1f} s (a quarter of the {:g} s deadline); "
          "counted out",
          number_, id, std::chrono::duration<double>(silence).count(), c_.round_deadline_s);
    }
  }
}

void round::heard_from(std::uint32_t dev, std::uint64_t step, bool resplit) {
  if (resplit) ++n_resplits_;
  if (at_ == round_phase::collecting && members_.count(dev) &&
      step / static_cast<std::uint64_t>(c_.local_steps) == number_) {
    heard_[dev] = clock::now();
    auto& [steps, last] = paces_[dev];
    steps = std::max(steps, static_cast<std::uint32_t>(step % static_cast<std::uint64_t>(c_.local_steps)) + 1);
    last = heard_[dev];
  }
}

asio::awaitable<bool> round::run(std::uint64_t number, float lr, global_model& g) {
  co_await open(number, lr, g);
  at_ = round_phase::collecting;
  if (c_.on_round_start) c_.on_round_start(number, static_cast<int>(participants_.size()));
  const auto deadline = clock::now() + std::chrono::milliseconds(static_cast<long>(c_.round_deadline_s * 1000));
  // A round waits for its members only: a device that leaves or comes back is counted out.
  const std::function<bool()> all_done = [this] {
    const auto& done = uploads_.done();
    return std::includes(done.begin(), done.end(), members_.begin(), members_.end());
  };
  if (c_.mode == training_mode::splitfed) {
    heard_.clear();
    for (auto id : participants_) {
      heard_[id] = clock::now();
      start_training(id, deadline);
    }
    if (c_.secure_aggregation) co_await secure_.roster(members_, deadline);
    const auto whole = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(c_.round_deadline_s));
    co_await collect(deadline, runtime::silence_allowed(whole), all_done);
  } else {
    co_await take_turns(deadline);
  }
  co_await wake_.wait_until(all_done, deadline);
  at_ = round_phase::closing;
  train_seconds_ = std::chrono::duration<double>(clock::now() - t0_).count();
  const std::size_t n_in = uploads_.done().size();
  if (n_in < participants_.size())
    spdlog::warn("server: round {}: {} of {} devices finished {}{}", number, n_in, participants_.size(),
                 !all_done()    ? fmt::format("within the {:g} s deadline", c_.round_deadline_s)
                 : overran_ > 0 ? (c_.mode == training_mode::sequential ? "(the others left or overran their turns)"
                                                                        : "(the others left or went silent)")
                                : "(the others left)",
                 n_in > 0     ? "; averaging those"
                 : all_done() ? "; nobody trained: the round runs again"
                              : "; nobody trained: the round runs again (slow devices? raise --deadline)");
  if (n_in == 0) {
    abandon();
    co_return false;
  }
  futile_ = 0;
  if (c_.secure_aggregation) {
    const secure_round::predicate is_member = [this](std::uint32_t d) { return members_.count(d) > 0; };
    const secure_round::predicate finished = [this](std::uint32_t d) { return uploads_.is_done(d); };
    const auto patience = std::chrono::milliseconds(static_cast<long>(c_.round_deadline_s * 1000));
    co_await secure_.aggregate(is_member, finished, *avg_, patience);
  }
  co_await close(g);
  co_return true;
}

void round::abandon() {
  ex_.post_compute([this, routes = routes_] { host_.discard(routes); });
  // Running it again from the same weights can only end the same way when every upload was
  // refused (a model that diverged to NaN on every device, or only hostile ones).
  futile_ = refused_.empty() ? 0 : futile_ + 1;
  if (futile_ >= max_futile)
    ex_.fail(std::make_exception_ptr(core::error("round " + std::to_string(number_) + ": every upload was refused in " +
                                                 std::to_string(futile_) + " attempts in a row (last: " + refused_ +
                                                 "); stopping rather than repeating it (a diverged model? "
                                                 "check --lr)")),
             "running rounds");
}

asio::awaitable<void> round::close(global_model& g) {
  const std::set<std::uint32_t> in = uploads_.done();
  auto routes = routes_;
  for (auto& [id, r] : routes) r = host_.route_of(id);  // re-splits during the round (left since, too)
  const bool last = number_ == static_cast<std::uint64_t>(c_.rounds);
  const bool evaluate = last || number_ % static_cast<std::uint64_t>(c_.eval_every) == 0;
  // Close and average (server replicas of the finished devices + uploads), then evaluate.
  auto average = [this, routes, in, evaluate, last, out = g]() mutable {
    host_.gather(routes, in, *avg_);
    avg_->result_into(out.params, out.buffers);
    evaluation ev = host_.evaluate(out, evaluate, last);
    return std::pair{std::move(out), ev};
  };
  auto [averaged, ev] = co_await ex_.compute(std::move(average));
  g = std::move(averaged);
  server_compute_ = ev.compute_s;
  const std::uint64_t bytes = host_.bytes_moved();
  uploads_.tally().bytes_moved += bytes - std::min(bytes, bytes0_);
  last_ = report(ev);
  co_await host_.closed(last_, routes);
  at_ = round_phase::idle;
}

round_report round::report(const evaluation& ev) const {
  const auto& t = uploads_.tally();
  round_report rep;
  rep.round = number_;
  rep.n_devices = static_cast<int>(uploads_.done().size());
  rep.n_participants = static_cast<int>(participants_.size());
  rep.seconds = std::chrono::duration<double>(clock::now() - t0_).count();
  rep.train_seconds = train_seconds_;
  rep.train_loss = t.mean_loss();
  rep.train_accuracy = t.accuracy();
  rep.evaluated = ev.test_samples > 0;
  rep.test_loss = rep.evaluated ? ev.report.loss : last_.test_loss;
  rep.test_accuracy = rep.evaluated ? ev.report.accuracy : last_.test_accuracy;
  rep.test_samples = rep.evaluated ? ev.test_samples : last_.test_samples;
  rep.device_compute_s = t.device_compute_s;
  rep.edge_compute_s = t.edge_compute_s;
  rep.server_compute_s = server_compute_;
  rep.bytes_moved = t.bytes_moved;
  rep.step_seconds = train_seconds_ / c_.local_steps;
  rep.predicted_step_seconds = host_.predicted_step(uploads_.done(), &rep.legs);
  rep.learning_rate = lr_;
  rep.n_resplits = n_resplits_;
  rep.secure_devices = secure_.n_aggregated();
  rep.secure_blocks = secure_.decoded();
  rep.planner_seconds = planner_s_;
  for (const auto& [id, r] : routes_)
    if (uploads_.is_done(id) && host_.attached(id, nullptr)) rep.routes.emplace_back(id, host_.route_of(id).str());
  return rep;
}

bool round::counted_out(std::uint32_t id, bool rejoined) {
  const bool was_in = members_.erase(id) > 0;
  if (rejoined) uploads_.forget(id);
  return was_in;
}

bool round::takes_step(std::uint32_t dev, std::uint64_t step, std::uint32_t attempt, bool device_activation) {
  // Not of a round closed, of an attempt at it that is over, or of a device counted out.
  const bool in = at_ == round_phase::collecting && members_.count(dev) && !uploads_.is_done(dev) &&
                  step / static_cast<std::uint64_t>(c_.local_steps) == number_ && attempt == attempt_;
  if (in) heard_from(dev, step);
  if (in && device_activation) uploads_.saw(dev);
  return in;
}

round::pace round::pace_of(std::uint32_t id) const {
  pace p;
  if (const auto it = paces_.find(id); it != paces_.end()) {
    const auto& [steps, last] = it->second;
    p = {steps, std::chrono::duration<double>(last - t0_).count() / steps};
  }
  if (uploads_.is_done(id)) p.steps = static_cast<std::uint32_t>(c_.local_steps);
  return p;
}

void round::add_loss(std::uint64_t number, double loss, std::int64_t n, std::uint64_t correct) {
  if (number == number_) uploads_.tally().add_loss(loss, n, correct);
}

void round::on_upload(const void* via, core::tier from, const std::string& who,
                      const std::vector<std::uint32_t>& devices, const wire::ReplicaUpload& r,
                      const protocol::weights_view& w) {
  // Of a round closed, or of an attempt at this one that nobody finished in time.
  if (!collects(r.round(), r.attempt())) return;
  // Parts for devices no longer in the round (counted out meanwhile) are neither checked nor
  // averaged. The others are held until the upload's final part: one bad part refuses it all.
  const auto counted = [this](std::uint32_t d) { return members_.count(d) > 0; };
  if (std::any_of(devices.begin(), devices.end(), counted)) try {
      // The routes in force now: a device that cut over to a new plan during the round told this
      // channel so (Cutover) before its upload.
      std::vector<split::route> routes;
      for (auto d : devices) routes.push_back(host_.route_of(d));
      uploads_.add(via, from, devices, routes, r, w);
    } catch (const core::error& e) {
      refused_ = who + ": " + e.what();
      ex_.metrics().add("cleave_refusals_total", {{"reason", "upload"}});
      throw core::error(who + ": replica of round " + std::to_string(number_) + " refused: " + e.what());
    }
  if (!r.final_part()) return;
  const auto in_now = [this](std::uint32_t d) { return members_.count(d) && !uploads_.is_done(d); };
  std::vector<std::uint32_t> finished;
  std::copy_if(devices.begin(), devices.end(), std::back_inserter(finished), in_now);
  const auto finishes = [&finished](std::uint32_t d) {
    return std::find(finished.begin(), finished.end(), d) != finished.end();
  };
  for (const auto& p : uploads_.complete(via, from, finished))
    if (p.weight > 0 && std::any_of(p.devices.begin(), p.devices.end(), finishes))
      avg_->add(p.first, p.end, p.weight, p.params, p.buffers);
  wake_.notify();
}

void round::on_secagg(std::uint32_t dev, const wire::SecAgg& m) {
  // Its phases run while the round collects and, after training, before it closes.
  if ((at_ != round_phase::collecting && at_ != round_phase::closing) || m.round() != number_ || !members_.count(dev) ||
      secure_.closed())
    return;  // of a round closed, or of a device counted out
  if (at_ == round_phase::collecting) heard_[dev] = clock::now();
  secure_.on_message(dev, m);
}

}  // namespace cleave::server
