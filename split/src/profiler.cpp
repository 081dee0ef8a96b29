// Per-block profiling on one backend, and the live rescaling of those profiles by measured
// segment times.
#include "cleave/split/profiler.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "cleave/core/random.h"
#include "cleave/core/stage.h"

namespace cleave::split {

std::uint64_t default_memory_budget() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;  // unknown: unlimited
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 2;
}

namespace {

std::uint64_t saved_bytes_of(const core::layer_ctx& c) {
  std::uint64_t n = 0;
  for (const auto& t : c.saved)
    if (t.defined()) n += t.bytes();
  for (const auto& child : c.children) n += saved_bytes_of(child);
  return n;
}

// t (any shape, f32) = uniform(-1, 1) from a seeded stream.
void fill_random(core::backend& b, const core::tensor& t, std::uint64_t stream) {
  std::vector<float> host(static_cast<std::size_t>(t.numel()));
  core::rng r(stream);
  for (auto& v : host) v = r.uniform(-1.0f, 1.0f);
  b.upload(t, host.data());
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::uint64_t least_segment_bytes(const core::model_spec& m, int begin, int end, const core::optimizer_config& opt,
                                  int batch) {
  CLEAVE_ASSERT(0 <= begin && begin <= end && end <= m.n_blocks(), "segment out of the model's blocks");
  if (begin == end) return 0;
  const double per_param = 2.0 + core::state_tensors(opt);  // the value, its gradient, the optimizer's
  double bytes = static_cast<double>(m.blocks[static_cast<std::size_t>(begin)].in.numel()) * batch;
  for (int i = begin; i < end; ++i) {
    const core::block_info& bi = m.blocks[static_cast<std::size_t>(i)];
    bytes += per_param * static_cast<double>(bi.n_params) + static_cast<double>(bi.n_buffers) +
             static_cast<double>(bi.out.numel()) * batch;
  }
  bytes *= 4;  // f32
  constexpr auto most = std::numeric_limits<std::uint64_t>::max();
  return bytes >= static_cast<double>(most) ? most : static_cast<std::uint64_t>(bytes);
}

std::vector<block_profile> profile_blocks(core::backend& b, const core::model_spec& m,
                                          const core::optimizer_config& opt, const profile_options& o) {
  if (o.batch < 1 || o.reps < 1 || o.warmup < 0)
    throw core::error("profile options: batch " + std::to_string(o.batch) + ", reps " + std::to_string(o.reps) +
                      ", warmup " + std::to_string(o.warmup) +
                      " (batch and reps must be at least 1, warmup at least 0)");
  const std::function<double()> now = o.clock ? o.clock : steady_seconds;
  std::vector<block_profile> out;
  out.reserve(static_cast<std::size_t>(m.n_blocks()));
  std::vector<int> unmeasured;  // blocks over the budget
  double measured_flops = 0, measured_fwd = 0, measured_bwd = 0;
  for (int i = 0; i < m.n_blocks(); ++i) {
    const core::block_info& bi = m.blocks[static_cast<std::size_t>(i)];
    block_profile p;
    p.param_bytes = static_cast<std::uint64_t>(bi.n_params + bi.n_buffers) * 4;
    // Gradients, then what the optimizer keeps per parameter.
    p.state_bytes = static_cast<std::uint64_t>(bi.n_params) * 4 * (1 + core::state_tensors(opt));
    p.output_bytes = static_cast<std::uint64_t>(bi.out.numel()) * 4;
    if (o.memory_budget && least_segment_bytes(m, i, i + 1, opt, o.batch) > o.memory_budget) {
      p.saved_bytes = p.output_bytes;
      unmeasured.push_back(i);
      out.push_back(p);
      continue;
    }
    core::stage s(b, m, i, i + 1, o.seed);

    const std::uint64_t stream = core::mix64(o.seed ^ core::mix64(static_cast<std::uint64_t>(i)));
    const core::tensor x = b.empty(bi.in.batched(o.batch));
    const core::tensor dy = b.empty(bi.out.batched(o.batch));
    fill_random(b, x, stream);
    fill_random(b, dy, stream + 1);
    const bool need_dx = i > 0;

    double fwd = std::numeric_limits<double>::infinity(), bwd = fwd;
    for (int r = 0; r < o.warmup + o.reps; ++r) {
      core::stage::context ctx;
      b.synchronize();
      double t0 = now();
      const core::tensor y = s.forward(x, ctx, core::mode::train, static_cast<std::uint32_t>(r));
      b.synchronize();
      const double tf = now() - t0;
      CLEAVE_ASSERT(y.shape() == bi.out.batched(o.batch), "block output shape differs from the model spec");
      if (r == 0) {
        std::uint64_t saved = 0;
        for (const auto& l : ctx.layers) saved += saved_bytes_of(l);
        p.saved_bytes = saved / static_cast<std::uint64_t>(o.batch);
      }
      t0 = now();
      s.backward(dy, ctx, need_dx);
      b.synchronize();
      const double tb = now() - t0;
      if (r >= o.warmup) {
        fwd = std::min(fwd, tf);
        bwd = std::min(bwd, tb);
      }
    }
    p.forward_seconds = std::max(0.0, fwd);  // a clock that went back counts as no time
    p.backward_seconds = std::max(0.0, bwd);
    measured_flops += bi.flops;
    measured_fwd += p.forward_seconds;
    measured_bwd += p.backward_seconds;
    out.push_back(p);
  }
  for (int i : unmeasured) {
    const double flops = m.blocks[static_cast<std::size_t>(i)].flops;
    auto& p = out[static_cast<std::size_t>(i)];
    p.forward_seconds = measured_flops > 0 ? flops * measured_fwd / measured_flops : 0;
    p.backward_seconds = measured_flops > 0 ? flops * measured_bwd / measured_flops : 0;
  }
  return out;
}

ewma::ewma(double alpha, int warmup) : alpha_(alpha), warmup_(warmup) {
  if (!(alpha > 0.0 && alpha <= 1.0) || warmup < 0)
    throw core::error("moving average: alpha " + std::to_string(alpha) + ", warmup " + std::to_string(warmup) +
                      " (need 0 < alpha <= 1 and warmup >= 0)");
}

void ewma::add(double x) {
  ++n_;
  if (n_ <= warmup_) return;
  value_ = n_ == warmup_ + 1 ? x : alpha_ * x + (1.0 - alpha_) * value_;
}

void ewma::reset() {
  n_ = 0;
  value_ = 0;
}

live_profile::live_profile(std::vector<block_profile> base, double alpha, int warmup)
    : base_(std::move(base)), alpha_(alpha), warmup_(warmup) {
  static_cast<void>(ewma(alpha, warmup));  // refuses bad settings now, not at the first observation
}

void live_profile::observe(int begin, int end, double seconds, int n_micro_batches) {
  if (begin < 0 || end < begin || end > n_blocks())
    throw core::error("live profile: segment [" + std::to_string(begin) + ", " + std::to_string(end) +
                      ") is outside the model's " + std::to_string(n_blocks()) + " blocks");
  if (n_micro_batches < 1)
    throw core::error("live profile: " + std::to_string(n_micro_batches) + " micro-batches (need at least 1)");
  if (!std::isfinite(seconds) || seconds < 0)
    throw core::error("live profile: measured time " + std::to_string(seconds) +
                      " s is not a finite, non-negative value");
  if (begin == end) return;
  auto it = std::find_if(segments_.begin(), segments_.end(),
                         [&](const segment& s) { return s.begin == begin && s.end == end; });
  if (it == segments_.end()) {
    segment s{begin, end, ewma(alpha_, warmup_), 0.0, 0};
    for (int i = begin; i < end; ++i) {
      const auto& p = base_[static_cast<std::size_t>(i)];
      s.base_seconds += p.forward_seconds + p.backward_seconds;
    }
    segments_.push_back(std::move(s));
    it = segments_.end() - 1;
  }
  it->per_micro_batch.add(seconds / n_micro_batches);
  it->last_seen = ++n_observed_;
}

double live_profile::scale_of(int block) const {
  CLEAVE_ASSERT(block >= 0 && block < n_blocks(), "block out of range");
  const segment* best = nullptr;
  int best_distance = std::numeric_limits<int>::max();
  for (const auto& s : segments_) {
    // Segments without profiled time cannot give a ratio.
    if (!s.per_micro_batch.ready() || !(s.base_seconds > 0)) continue;
    const int d = block < s.begin ? s.begin - block : block >= s.end ? block - s.end + 1 : 0;
    if (d < best_distance || (d == best_distance && s.last_seen > best->last_seen)) {
      best = &s;
      best_distance = d;
    }
  }
  return best ? best->per_micro_batch.value() / best->base_seconds : 1.0;
}

std::vector<double> live_profile::step_seconds(int n_micro_batches) const {
  if (n_micro_batches < 1)
    throw core::error("live profile: " + std::to_string(n_micro_batches) + " micro-batches (need at least 1)");
  std::vector<double> out(base_.size());
  for (int i = 0; i < n_blocks(); ++i) {
    const auto& p = base_[static_cast<std::size_t>(i)];
    out[static_cast<std::size_t>(i)] = (p.forward_seconds + p.backward_seconds) * n_micro_batches * scale_of(i);
  }
  return out;
}

node_profile current_profile(const live_profile& lp, std::uint32_t node_id, std::uint32_t batch,
                             std::string_view backend, std::uint64_t memory_budget) {
  node_profile p;
  p.node_id = node_id;
  p.batch = batch;
  p.backend = std::string(backend);
  p.memory_budget_bytes = memory_budget;
  p.blocks = lp.base();
  for (int i = 0; i < lp.n_blocks(); ++i) {
    const double k = lp.scale_of(i);
    auto& b = p.blocks[static_cast<std::size_t>(i)];
    b.forward_seconds *= k;
    b.backward_seconds *= k;
  }
  return p;
}

}  // namespace cleave::split
