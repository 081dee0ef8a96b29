// Segments of device routes hosted by one node.
#include "cleave/core/pipeline.h"

#include "cleave/core/trainer.h"

namespace cleave::core {

segment_host::segment_host(backend& b, const model_spec& m, const optimizer_config& opt, std::uint64_t seed)
    : b_(&b), m_(&m), opt_(opt), seed_(seed) {}

void segment_host::host(std::uint32_t device, const route& r, int segment, bool shared) {
  CLEAVE_ASSERT(segment >= 0 && segment < r.n_segments());
  const int begin = r.begin(segment), end = r.end(segment);
  std::shared_ptr<replica> rep;
  if (shared) {
    auto& s = shared_[{begin, end}];
    if (!s) s = std::make_shared<replica>();
    rep = s;
  } else {
    rep = std::make_shared<replica>();
  }
  if (!rep->st) {
    rep->st = std::make_unique<stage>(*b_, *m_, begin, end, seed_);
    rep->opt = std::make_unique<optimizer>(*b_, opt_, rep->st->n_params());
  }
  slot& s = slots_[{device, segment}];
  s.r = r;
  s.segment = segment;
  s.rep = std::move(rep);
  s.pending.clear();
  s.done.clear();
}

void segment_host::drop_device(std::uint32_t device) {
  for (auto it = slots_.begin(); it != slots_.end();) it = it->first.first == device ? slots_.erase(it) : std::next(it);
}

bool segment_host::hosts(std::uint32_t device, int segment) const {
  return slots_.count({device, segment}) > 0;
}

segment_host::slot& segment_host::at(std::uint32_t device, int segment) {
  const auto it = slots_.find({device, segment});
  if (it == slots_.end())
    throw error("segment " + std::to_string(segment) + " of device " + std::to_string(device) + " is not hosted here");
  return it->second;
}

stage& segment_host::stage_of(std::uint32_t device, int segment) {
  return *at(device, segment).rep->st;
}
optimizer& segment_host::optimizer_of(std::uint32_t device, int segment) {
  return *at(device, segment).rep->opt;
}

bool segment_host::finish_micro_batch(slot& s, micro_batch_id id, std::uint32_t n_micro_batches) {
  auto& n = s.done[id.step];
  if (++n < n_micro_batches) return false;
  s.done.erase(id.step);
  replica& r = *s.rep;
  r.opt->step(r.st->params(), r.st->grads());
  r.st->zero_grad();
  return true;
}

segment_output segment_host::forward(std::uint32_t device, int segment, micro_batch_id id, const tensor& x,
                                     const tensor& labels, float micro_batch_scale, std::uint32_t n_micro_batches,
                                     std::uint32_t dropout_seed) {
  slot& s = at(device, segment);
  if (n_micro_batches == 0) throw error("a step needs at least one micro-batch");
  const shape& want = m_->blocks.empty() ? m_->input
                      : s.r.begin(segment) < m_->n_blocks()
                          ? m_->blocks[static_cast<std::size_t>(s.r.begin(segment))].in
                          : m_->blocks.back().out;
  if (x.shape().rank() < 1 || !(x.shape().numel_from(1) == want.numel()) || x.shape()[0] < 1)
    throw error("activation " + x.shape().str() + " for block " + std::to_string(s.r.begin(segment)) +
                " does not match its input " + want.str());
  const std::int64_t batch = x.shape()[0];
  n_mb_[{device, segment}] = n_micro_batches;
  const bool loss_here = segment + 1 == s.r.n_segments();
  stage::context ctx;
  tensor y = s.rep->st->forward(x.reshaped(want.batched(batch)), ctx, mode::train, dropout_seed);
  segment_output out;
  if (!loss_here) {
    s.pending[id] = {std::move(ctx), y.shape()};
    out.dir = segment_output::direction::up;
    out.value = y;
    return out;
  }
  if (!labels.defined() || labels.dtype() != dtype::i32 || labels.numel() != y.shape()[0])
    throw error("the loss of device " + std::to_string(device) + " needs " + std::to_string(y.shape()[0]) + " labels");
  // Labels may come from the network: check them before any op sees them.
  std::vector<std::int32_t> lab(static_cast<std::size_t>(labels.numel()));
  b_->download(labels, lab.data());
  for (auto l : lab)
    if (l < 0 || l >= m_->n_classes) throw error("label " + std::to_string(l) + " out of range");
  const loss_result lr = loss_forward(*b_, y, labels);
  std::vector<float> logits(static_cast<std::size_t>(y.numel()));
  b_->download(y, logits.data());
  b_->download(lr.loss, &out.loss);
  out.n_correct = static_cast<std::uint32_t>(count_correct(logits, lab.data(), y.shape()[0], m_->n_classes));
  tensor dx = s.rep->st->backward(loss_backward(*b_, lr, labels, micro_batch_scale), ctx, segment > 0);
  out.stepped = finish_micro_batch(s, id, n_micro_batches);
  out.dir = segment > 0 ? segment_output::direction::down : segment_output::direction::none;
  out.value = dx;
  return out;
}

segment_output segment_host::backward(std::uint32_t device, int segment, micro_batch_id id, const tensor& dy) {
  slot& s = at(device, segment);
  const auto it = s.pending.find(id);
  if (it == s.pending.end())
    throw error("gradient for step " + std::to_string(id.step) + " micro-batch " + std::to_string(id.micro_batch) +
                " of device " + std::to_string(device) + " has no forward pass here");
  const shape& want = it->second.out;
  if (dy.numel() != want.numel() || dy.shape().rank() < 1 || dy.shape()[0] != want[0])
    throw error("gradient " + dy.shape().str() + " for step " + std::to_string(id.step) + " does not match the " +
                "activation " + want.str() + " sent up");
  segment_output out;
  tensor dx = s.rep->st->backward(dy.reshaped(want), it->second.ctx, segment > 0);
  s.pending.erase(it);
  out.stepped = finish_micro_batch(s, id, n_mb_[{device, segment}]);
  out.dir = segment > 0 ? segment_output::direction::down : segment_output::direction::none;
  out.value = dx;
  return out;
}

void segment_host::discard_pending(std::uint32_t device) {
  for (auto& [key, s] : slots_)
    if (key.first == device) {
      s.pending.clear();
      s.done.clear();
      if (s.rep->st) s.rep->st->zero_grad();
    }
}

std::size_t segment_host::n_pending() const {
  std::size_t n = 0;
  for (const auto& [key, s] : slots_) n += s.pending.size();
  return n;
}

}  // namespace cleave::core
