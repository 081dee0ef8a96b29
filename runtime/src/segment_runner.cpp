// One segment runner for device, edge and server: the split step as one path through the
// segment host, whichever tier runs it.
#include "cleave/runtime/segment_runner.h"

#include <spdlog/spdlog.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "cleave/core/error.h"
#include "cleave/core/micro_batch_seed.h"
#include "cleave/protocol/tensor_io.h"
#include "cleave/split/replica_checks.h"

namespace cleave::runtime {

namespace {

double thread_cpu_seconds() {
  timespec t{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return 0;
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

}  // namespace

using clock = std::chrono::steady_clock;

segment_runner::segment_runner(core::backend& b, core::tier here, std::uint32_t node_id, double slowdown)
    : b_(&b), here_(here), node_id_(node_id), slowdown_(slowdown) {}

bool segment_runner::set_model(const std::string& json, const protocol::training_settings& t) {
  if (host_ && json == model_json_) return false;
  model_ = core::parse_model_spec(json, "plan");
  model_json_ = json;
  training_ = t;
  host_ = std::make_unique<split::segment_host>(*b_, model_, t.opt, t.seed);
  held_.clear();
  live_ = {};
  return true;
}

double segment_runner::timed(const std::function<void()>& f) {
  if (shared_) shared_->acquire();  // timed once it holds a core
  const auto t0 = clock::now();
  const bool slowed = slowdown_ > 1.0;
  const double cpu0 = slowed ? thread_cpu_seconds() : 0.0;
  try {
    f();
    b_->synchronize();
  } catch (...) {
    if (shared_) shared_->release();
    throw;
  }
  const double secs = std::chrono::duration<double>(clock::now() - t0).count();
  const double cpu = slowed ? thread_cpu_seconds() - cpu0 : 0.0;
  if (shared_) shared_->release();
  if (!slowed) {
    compute_s_ += secs * slowdown_;
    return secs * slowdown_;
  }
  // An emulated board this many times slower: wait for the extra time its work would have
  // taken. Where the kernels ran on this thread their work is its CPU time, so a machine busy
  // with other work delays the step once rather than `slowdown` times over.
  const double work = b_->computes_on_caller() && cpu > 0 ? std::min(secs, cpu) : secs;
  const double extra = work * (slowdown_ - 1.0);
  std::this_thread::sleep_for(std::chrono::duration<double>(extra));
  compute_s_ += secs + extra;
  return secs + extra;
}

int segment_runner::segment_at(const split::route& r, std::uint32_t block, core::tier from, bool activation) const {
  // Entered from below at its first block, or from above at its end; the neighbour tier tells
  // apart a U-shape's two segments on one tier.
  for (int s : r.segments_on(here_)) {
    const int nb = activation ? s - 1 : s + 1;
    if (nb < 0 || nb >= r.n_segments() || r.path[static_cast<std::size_t>(nb)] != from) continue;
    if (static_cast<std::uint32_t>(activation ? r.begin(s) : r.end(s)) == block) return s;
  }
  throw core::error(std::string(activation ? "activation" : "gradient") + " for block " + std::to_string(block) +
                    " from the " + std::string(core::tier_name(from)) + " does not enter a segment of route " +
                    r.str() + " on the " + std::string(core::tier_name(here_)));
}

step_result segment_runner::run(std::uint32_t device, const split::route& r, std::uint32_t epoch, core::tier from,
                                const transport::message& m, const core::tensor* labels) {
  if (!host_) throw core::error("a step message before any plan");
  if (const auto* a = m.as<wire::Activations>()) {
    const int seg = segment_at(r, a->block(), from, true);
    if (seg > r.loss_segment())
      throw core::error("activation for block " + std::to_string(a->block()) + " past the loss of route " + r.str());
    // Labels travel up to the loss with the activations, except in U-shape: they stay below.
    if (r.u_shape() == (a->labels() != nullptr))
      throw core::error(r.u_shape() ? "labels sent in a U-shaped plan" : "activation without labels for the loss");
    const split::micro_batch_id id{a->step(), a->micro_batch()};
    const auto bi = protocol::batch_of(*a);
    const core::tensor x = protocol::to_backend(*b_, transport::view_of(*a->activation()));
    core::tensor y = labels ? *labels : core::tensor{};
    if (a->labels()) y = protocol::to_backend(*b_, transport::view_of(*a->labels()));
    split::segment_output o;
    const double secs = timed([&] {
      o = host_->forward(device, seg, id, x, y, static_cast<float>(x.shape()[0]) / static_cast<float>(bi.batch_size),
                         bi.n_micro_batches,
                         static_cast<std::uint32_t>(
                             core::micro_batch_seed(0, device, id.step, id.micro_batch, core::stream::dropout)));
    });
    batch_[device] = bi;
    auto res = finish(device, r, epoch, a->attempt(), seg, id, bi, std::move(o), y, secs, true);
    res.n_samples = x.shape()[0];
    return res;
  }
  const auto* g = m.as<wire::Gradients>();
  if (!g) throw core::error("not a step message: " + std::string(transport::body_name(m.type())));
  const int seg = segment_at(r, g->block(), from, false);
  const split::micro_batch_id id{g->step(), g->micro_batch()};
  core::tensor dy = protocol::to_backend(*b_, transport::view_of(*g->gradient()));
  // Segment 0 is a device's bottom: this gradient came back through its bottom cut.
  if (seg == 0) dy = filters_.gradient(*b_, {device, id.step, id.micro_batch}, dy);
  split::segment_output o;
  const double secs = timed([&] { o = host_->backward(device, seg, id, dy); });
  // The loss computed above travels down with the gradient, to whoever reports it.
  o.loss = g->loss();
  o.n_correct = g->n_correct();
  auto res = finish(device, r, epoch, g->attempt(), seg, id, batch_[device], std::move(o), {}, secs, false);
  res.n_samples = dy.shape()[0];
  return res;
}

step_result segment_runner::run_input(std::uint32_t device, const split::route& r, std::uint32_t epoch,
                                      std::uint32_t attempt, split::micro_batch_id id, const core::tensor& x,
                                      const core::tensor& y, const protocol::batch_info& bi,
                                      std::span<const std::int32_t> host_y) {
  split::segment_output o;
  const double secs = timed([&] {
    o = host_->forward(
        device, 0, id, x, y, static_cast<float>(x.shape()[0]) / static_cast<float>(bi.batch_size), bi.n_micro_batches,
        static_cast<std::uint32_t>(core::micro_batch_seed(0, device, id.step, id.micro_batch, core::stream::dropout)));
  });
  batch_[device] = bi;
  if (o.dir == split::segment_output::direction::up) {
    privacy::departure d(*b_, {device, id.step, id.micro_batch}, x, y, host_y, bi.batch_size,
                         host_->model().label_groups);
    o.value = filters_.output(*b_, d, o.value);
  }
  auto res = finish(device, r, epoch, attempt, 0, id, bi, std::move(o), y, secs, true);
  res.n_samples = x.shape()[0];
  return res;
}

step_result segment_runner::finish(std::uint32_t device, const split::route& r, std::uint32_t epoch,
                                   std::uint32_t attempt, int seg, split::micro_batch_id id,
                                   const protocol::batch_info& bi, split::segment_output o, const core::tensor& labels,
                                   double seconds, bool forward) {
  step_result res;
  double& spent = seg_seconds_[{device, seg}];
  spent += seconds;
  if (o.stepped) {
    // One whole step of this segment: the live profile learns what it costs here, in
    // micro-batches of the profiled size.
    const double mb = static_cast<double>(bi.batch_size) / std::max(1u, bi.n_micro_batches);
    if (r.begin(seg) < r.end(seg) && live_.n_blocks() == model_.n_blocks() && mb > 0) {
      live_.observe(r.begin(seg), r.end(seg), spent * profile_batch_ / mb,
                    static_cast<int>(std::max(1u, bi.n_micro_batches)));
      ++n_observed_;
    }
    spent = 0;
    res.stepped = true;
  }
  res.loss = o.loss;
  res.n_correct = o.n_correct;
  res.loss_here = forward && o.dir != split::segment_output::direction::up;  // into the loss here
  // Hop k joins segments k and k + 1: the activation goes up hop seg, the gradient down hop seg - 1.
  const auto cut = cut_.find(device);
  const auto seed =
      static_cast<std::uint32_t>(core::micro_batch_seed(0, device, id.step, id.micro_batch, core::stream::codec));
  // Decided by the route this step runs under (a re-split's settings may arrive before its
  // cutover): the output's hop goes f32, see cut_settings::keep_output_exact.
  const auto spec = [&](int hop, bool up) {
    return cut == cut_.end() || r.end(hop) == r.n_blocks ? core::codec_spec{} : cut->second.spec(hop, up, seed);
  };
  if (o.dir == split::segment_output::direction::up) {
    const protocol::step_key key{epoch,  id.step, id.micro_batch, device, static_cast<std::uint32_t>(r.end(seg)),
                                 attempt};
    const bool pass_labels = !r.u_shape() && labels.defined();
    res.out = protocol::make_activations(key, bi, *b_, o.value, pass_labels ? &labels : nullptr, spec(seg, true));
    res.to = r.path[static_cast<std::size_t>(seg + 1)];
  } else if (o.dir == split::segment_output::direction::down) {
    if (res.loss_here) o.value = filters_.loss_gradient(*b_, {device, id.step, id.micro_batch}, o.value);
    const protocol::step_key key{epoch,  id.step, id.micro_batch, device, static_cast<std::uint32_t>(r.begin(seg)),
                                 attempt};
    const core::codec_spec cs = spec(seg - 1, false);
    std::vector<float>* residual =
        cs.id == core::codec::topk && cut->second.topk_feedback ? &residual_[{device, seg, id.micro_batch}] : nullptr;
    res.out = protocol::make_gradients(key, *b_, o.value, o.loss, o.n_correct, cs, residual);
    res.to = r.path[static_cast<std::size_t>(seg - 1)];
  }
  return res;
}

void segment_runner::set_cut(std::uint32_t device, protocol::cut_settings c) {
  cut_[device] = std::move(c);
}

void segment_runner::submit(std::uint32_t device, std::function<void()> task) {
  if ((host_ && host_->n_missing(device) > 0) || held_.count(device)) {
    held_[device].push_back(std::move(task));
    return;
  }
  task();
}

void segment_runner::release(std::uint32_t device) {
  const auto it = held_.find(device);
  if (it == held_.end() || host_->n_missing(device) > 0) return;
  auto tasks = std::move(it->second);
  held_.erase(it);
  for (auto& t : tasks) t();
}

void segment_runner::discard(std::uint32_t device, bool segments) {
  held_.erase(device);
  filters_.discard(device);
  std::erase_if(seg_seconds_, [device](const auto& kv) { return kv.first.first == device; });
  if (!host_) return;
  if (segments) {
    // A new plan: its streams start without feedback (their shapes may differ).
    std::erase_if(residual_, [device](const auto& kv) { return std::get<0>(kv.first) == device; });
    host_->drop_device(device);
  } else {
    host_->discard_pending(device);
  }
}

std::vector<std::pair<core::tier, transport::message_builder>> segment_runner::rehost(std::uint32_t device,
                                                                                      const split::route& from,
                                                                                      const split::route& to,
                                                                                      const protocol::migrate_desc& md,
                                                                                      bool fresh_optimizer) {
  std::vector<std::pair<core::tier, transport::message_builder>> out;
  std::vector<split::block_state> leaving;
  timed([&] { leaving = host_->rehost(device, from, to, here_); });
  for (auto& bs : leaving) {
    if (fresh_optimizer)
      for (auto& v : bs.optimizer_state) std::fill(v.begin(), v.end(), 0.0f);
    out.emplace_back(split::tier_of_block(to, bs.begin), protocol::make_migrate(md, to, bs));
  }
  release(device);
  return out;
}

void segment_runner::install(std::uint32_t device, const wire::Migrate& m) {
  split::block_state st = protocol::block_state_of(m, model_);
  timed([&] { host_->install_blocks(device, std::move(st)); });
  release(device);
}

void segment_runner::load(std::uint32_t device, const split::route& r, std::span<const float> params,
                          std::span<const float> buffers, bool shared) {
  for (int seg : r.segments_on(here_)) {
    if (!host_->hosts(device, r, seg)) host_->host(device, r, seg, shared);
    protocol::install(host_->stage_of(device, seg), params, buffers);
  }
}

std::vector<segment_runner::replica> segment_runner::replicas(std::uint32_t device, const split::route& r,
                                                              std::set<std::pair<int, int>>* seen) {
  std::vector<replica> out;
  for (int seg : r.segments_on(here_)) {
    if (r.begin(seg) == r.end(seg) || !host_->hosts(device, seg)) continue;
    if (seen && !seen->insert({r.begin(seg), r.end(seg)}).second) continue;
    core::stage& st = host_->stage_of(device, seg);
    replica& rep = out.emplace_back(replica{r.begin(seg), r.end(seg), {}, {}});
    rep.params.resize(static_cast<std::size_t>(st.n_params()));
    rep.buffers.resize(static_cast<std::size_t>(st.n_buffers()));
    if (!rep.params.empty()) b_->download(st.params(), rep.params.data());
    if (!rep.buffers.empty()) b_->download(st.buffers(), rep.buffers.data());
    // Trained here on what the device sent (activations, gradients): a device that sent
    // non-finite values would poison the average through this replica.
    std::string bad = split::first_non_finite(rep.params, "parameter");
    if (bad.empty()) bad = split::first_non_finite(rep.buffers, "state value");
    if (!bad.empty()) {
      spdlog::warn(
          "{} {}: device {}: its replica of blocks [{},{}) here holds a non-finite value after the round ({}; "
          "trained on what it sent); left out of the average",
          core::tier_name(here_), node_id_, device, rep.first, rep.end, bad);
      out.pop_back();
    }
  }
  return out;
}

std::vector<segment_runner::optimizer_state> segment_runner::optimizer_states(std::uint32_t device,
                                                                              const split::route& r) {
  std::vector<optimizer_state> out;
  for (int seg : r.segments_on(here_)) {
    if (r.begin(seg) == r.end(seg) || !host_->hosts(device, r, seg)) continue;
    const core::optimizer& opt = host_->optimizer_of(device, seg);
    optimizer_state& s = out.emplace_back(optimizer_state{r.begin(seg), r.end(seg), {}, opt.steps_taken()});
    for (const auto& t : opt.state()) {
      auto& v = s.tensors.emplace_back(static_cast<std::size_t>(t.numel()));
      if (!v.empty()) b_->download(t, v.data());
    }
  }
  return out;
}

void segment_runner::restore_optimizer(std::uint32_t device, const split::route& r,
                                       const std::vector<optimizer_state>& states) {
  for (const auto& s : states) {
    int seg = -1;
    for (int k : r.segments_on(here_))
      if (r.begin(k) == s.first && r.end(k) == s.end && host_->hosts(device, r, k)) seg = k;
    if (seg < 0)
      throw core::error("optimizer state of blocks [" + std::to_string(s.first) + "," + std::to_string(s.end) +
                        ") of device " + std::to_string(device) + " fits no segment of route " + r.str() + " here");
    core::optimizer& opt = host_->optimizer_of(device, seg);
    if (s.tensors.size() != opt.state().size())
      throw core::error("optimizer state of blocks [" + std::to_string(s.first) + "," + std::to_string(s.end) + "): " +
                        std::to_string(s.tensors.size()) + " tensors, expected " + std::to_string(opt.state().size()));
    for (std::size_t k = 0; k < s.tensors.size(); ++k) {
      if (static_cast<std::int64_t>(s.tensors[k].size()) != opt.state()[k].numel())
        throw core::error("optimizer state of blocks [" + std::to_string(s.first) + "," + std::to_string(s.end) +
                          "): " + std::to_string(s.tensors[k].size()) + " values, expected " +
                          std::to_string(opt.state()[k].numel()));
      if (!s.tensors[k].empty()) b_->upload(opt.state()[k], s.tensors[k].data());
    }
    opt.set_steps_taken(s.steps);
  }
}

std::vector<split::block_profile> shared_board::profile(
    const std::string& key, const std::function<std::vector<split::block_profile>()>& measure, bool& measured) {
  std::lock_guard lock(mu_);  // the others wait for the first measurement rather than disturb it
  auto it = done_.find(key);
  measured = it == done_.end();
  if (measured) it = done_.emplace(key, measure()).first;
  return it->second;
}

void segment_runner::profile(std::uint32_t batch, const protocol::training_settings& t, std::uint64_t memory_budget) {
  const auto t0 = clock::now();
  split::profile_options po;
  po.batch = static_cast<int>(std::max(1u, batch));
  po.seed = t.seed;
  po.memory_budget = memory_budget;
  bool measured = true;
  auto measure = [&] { return split::profile_blocks(*b_, model_, t.opt, po); };
  auto base = shared_ ? shared_->profile(b_->name() + "|" + std::to_string(po.batch) + "|" + core::to_json(t.opt) +
                                             "|" + std::to_string(memory_budget) + "|" + model_json_,
                                         measure, measured)
                      : measure();
  double total = 0;
  for (auto& blk : base) {
    blk.forward_seconds *= slowdown_;
    blk.backward_seconds *= slowdown_;
    total += blk.forward_seconds + blk.backward_seconds;
  }
  live_ = split::live_profile(std::move(base));
  profile_batch_ = static_cast<std::uint32_t>(po.batch);
  profile_budget_ = memory_budget;
  n_observed_ = n_observed_mark_ = 0;
  if (measured)
    spdlog::info("{} {}: profiled {} blocks on {} in {:.2f} s: {:.2f} ms per micro-batch of {}", core::tier_name(here_),
                 node_id_, model_.n_blocks(), b_->name(), std::chrono::duration<double>(clock::now() - t0).count(),
                 total * 1e3, po.batch);
  else
    spdlog::info("{} {}: the block profile of its board: {:.2f} ms per micro-batch of {}", core::tier_name(here_),
                 node_id_, total * 1e3, po.batch);
}

bool segment_runner::reprofile_if_idle() {
  if (!profiled() || n_observed_ != n_observed_mark_) {
    n_observed_mark_ = n_observed_;
    return false;
  }
  profile(profile_batch_, training_, profile_budget_);
  return true;
}

split::node_profile segment_runner::snapshot(std::uint64_t memory_budget) const {
  return split::current_profile(live_, node_id_, profile_batch_, b_->name(), memory_budget);
}

double segment_runner::take_compute_seconds() {
  return std::exchange(compute_s_, 0.0);
}

}  // namespace cleave::runtime
