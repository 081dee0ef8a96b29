// Segments of device routes hosted by one node.
#include "cleave/split/pipeline.h"

#include <algorithm>

#include "cleave/core/micro_batch_seed.h"
#include "cleave/core/trainer.h"

namespace cleave::split {

segment_host::segment_host(core::backend& b, const core::model_spec& m, const core::optimizer_config& opt,
                           std::uint64_t seed)
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
    rep->st = std::make_unique<core::stage>(*b_, *m_, begin, end, seed_);
    rep->opt = std::make_unique<core::optimizer>(*b_, opt_, rep->st->n_params());
  }
  if (const auto lr = lr_.find(device); lr != lr_.end()) rep->opt->set_lr(lr->second);
  slot& s = slots_[{device, segment}];
  s.r = r;
  s.segment = segment;
  s.rep = std::move(rep);
  s.pending.clear();
  s.done.clear();
}

void segment_host::set_learning_rate(std::uint32_t device, float lr) {
  lr_[device] = lr;
  for (auto& [key, s] : slots_)
    if (key.first == device) s.rep->opt->set_lr(lr);
}

void segment_host::drop_device(std::uint32_t device) {
  for (auto it = slots_.begin(); it != slots_.end();) it = it->first.first == device ? slots_.erase(it) : std::next(it);
  arrivals_.erase(device);
}

namespace {

std::string blocks_str(int begin, int end) {
  return "blocks [" + std::to_string(begin) + "," + std::to_string(end) + ")";
}

std::vector<float> download_all(core::backend& b, const core::tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  if (!v.empty()) b.download(t, v.data());
  return v;
}

}  // namespace

// Everything a node holds of one device, gathered into whole-model host vectors.
struct segment_host::gathered {
  std::vector<float> params, buffers;
  std::vector<std::vector<float>> state;  // optimizer state tensors, each like params
  std::vector<bool> have;                 // per block
  std::int64_t steps = 0;
};

segment_host::gathered segment_host::gather(std::uint32_t device, const route& from, core::tier here) const {
  const auto lay = core::layout_of(*m_);
  const auto n_params = static_cast<std::size_t>(lay.param_offset.back());
  const std::size_t n_state = opt_.kind == core::optimizer_kind::adamw
                                  ? 2
                                  : (opt_.kind == core::optimizer_kind::sgd && opt_.momentum != 0.0f ? 1 : 0);
  gathered g{std::vector<float>(n_params), std::vector<float>(static_cast<std::size_t>(lay.buffer_offset.back())),
             std::vector<std::vector<float>>(n_state, std::vector<float>(n_params)),
             std::vector<bool>(static_cast<std::size_t>(m_->n_blocks()), false), 0};
  for (int seg : from.segments_on(here)) {
    const auto it = slots_.find({device, seg});
    if (it == slots_.end()) continue;
    const slot& sl = it->second;
    if (!sl.pending.empty())
      throw core::error("re-split of device " + std::to_string(device) + " with micro-batches still in flight");
    for (const auto& [range, rep] : shared_)
      if (rep == sl.rep) throw core::error("re-splitting needs one replica per device (splitfed mode)");
    const core::stage& st = *sl.rep->st;
    const auto p0 = static_cast<std::size_t>(lay.param_offset[static_cast<std::size_t>(st.begin())]);
    const auto b0 = static_cast<std::size_t>(lay.buffer_offset[static_cast<std::size_t>(st.begin())]);
    const auto p = download_all(*b_, st.params()), bu = download_all(*b_, st.buffers());
    std::copy(p.begin(), p.end(), g.params.begin() + static_cast<std::ptrdiff_t>(p0));
    std::copy(bu.begin(), bu.end(), g.buffers.begin() + static_cast<std::ptrdiff_t>(b0));
    const auto& os = sl.rep->opt->state();
    for (std::size_t k = 0; k < n_state && k < os.size(); ++k) {
      const auto v = download_all(*b_, os[k]);
      std::copy(v.begin(), v.end(), g.state[k].begin() + static_cast<std::ptrdiff_t>(p0));
    }
    g.steps = std::max(g.steps, sl.rep->opt->steps_taken());
    for (int i = st.begin(); i < st.end(); ++i) g.have[static_cast<std::size_t>(i)] = true;
  }
  return g;
}

std::vector<block_state> segment_host::leaving(const gathered& g, const route& to, core::tier here) const {
  const auto lay = core::layout_of(*m_);
  // Blocks leaving this tier, as maximal runs going to one tier.
  std::vector<block_state> lost;
  auto slice = [&](int b, int e) {
    block_state s;
    s.begin = b;
    s.end = e;
    const auto p0 = lay.param_offset[static_cast<std::size_t>(b)], p1 = lay.param_offset[static_cast<std::size_t>(e)];
    const auto b0 = lay.buffer_offset[static_cast<std::size_t>(b)], b1 = lay.buffer_offset[static_cast<std::size_t>(e)];
    s.params.assign(g.params.begin() + p0, g.params.begin() + p1);
    s.buffers.assign(g.buffers.begin() + b0, g.buffers.begin() + b1);
    for (const auto& v : g.state) s.optimizer_state.emplace_back(v.begin() + p0, v.begin() + p1);
    s.optimizer_steps = g.steps;
    return s;
  };
  for (int i = 0; i < m_->n_blocks();) {
    if (!g.have[static_cast<std::size_t>(i)] || tier_of_block(to, i) == here) {
      ++i;
      continue;
    }
    int j = i + 1;
    while (j < m_->n_blocks() && g.have[static_cast<std::size_t>(j)] && tier_of_block(to, j) == tier_of_block(to, i))
      ++j;
    lost.push_back(slice(i, j));
    i = j;
  }
  return lost;
}

void segment_host::seed_segment(replica& rep, const gathered& g) {
  const auto lay = core::layout_of(*m_);
  const core::stage& st = *rep.st;
  const auto p0 = lay.param_offset[static_cast<std::size_t>(st.begin())];
  const auto b0 = lay.buffer_offset[static_cast<std::size_t>(st.begin())];
  auto np = download_all(*b_, st.params()), nb = download_all(*b_, st.buffers());
  std::vector<std::vector<float>> ns;
  for (const auto& t : rep.opt->state()) ns.push_back(download_all(*b_, t));
  for (int i = st.begin(); i < st.end(); ++i) {
    if (!g.have[static_cast<std::size_t>(i)]) continue;
    const auto u = static_cast<std::size_t>(i);
    for (auto k = lay.param_offset[u]; k < lay.param_offset[u + 1]; ++k) {
      np[static_cast<std::size_t>(k - p0)] = g.params[static_cast<std::size_t>(k)];
      for (std::size_t q = 0; q < ns.size() && q < g.state.size(); ++q)
        ns[q][static_cast<std::size_t>(k - p0)] = g.state[q][static_cast<std::size_t>(k)];
    }
    for (auto k = lay.buffer_offset[u]; k < lay.buffer_offset[u + 1]; ++k)
      nb[static_cast<std::size_t>(k - b0)] = g.buffers[static_cast<std::size_t>(k)];
  }
  if (!np.empty()) b_->upload(st.params(), np.data());
  if (!nb.empty()) b_->upload(st.buffers(), nb.data());
  for (std::size_t q = 0; q < ns.size(); ++q)
    if (!ns[q].empty()) b_->upload(rep.opt->state()[q], ns[q].data());
  rep.opt->set_steps_taken(g.steps);
}

std::vector<block_state> segment_host::rehost(std::uint32_t device, const route& from, const route& to,
                                              core::tier here) {
  if (from.n_blocks != m_->n_blocks() || to.n_blocks != m_->n_blocks())
    throw core::error("re-split of device " + std::to_string(device) + ": routes do not match the model's " +
                      std::to_string(m_->n_blocks()) + " blocks");
  const gathered g = gather(device, from, here);
  std::vector<block_state> lost = leaving(g, to, here);
  // The new segments: kept blocks from the gathered state, arriving blocks marked missing.
  for (auto it = slots_.begin(); it != slots_.end();) it = it->first.first == device ? slots_.erase(it) : std::next(it);
  for (auto it = n_mb_.begin(); it != n_mb_.end();) it = it->first.first == device ? n_mb_.erase(it) : std::next(it);
  arrival& arr = arrivals_[device];
  arr.missing.clear();
  for (int seg : to.segments_on(here)) {
    host(device, to, seg);
    replica& rep = *slots_.at({device, seg}).rep;
    for (int i = rep.st->begin(); i < rep.st->end(); ++i)
      if (!g.have[static_cast<std::size_t>(i)]) arr.missing.insert(i);
    seed_segment(rep, g);
  }
  std::vector<block_state> early = std::move(arr.early);
  arr.early.clear();
  for (auto& e : early) install_blocks(device, std::move(e));
  return lost;
}

void segment_host::install_blocks(std::uint32_t device, block_state s) {
  const auto lay = core::layout_of(*m_);
  if (s.begin < 0 || s.begin >= s.end || s.end > m_->n_blocks())
    throw core::error("migrated " + blocks_str(s.begin, s.end) + " of device " + std::to_string(device) +
                      " are outside the model's " + std::to_string(m_->n_blocks()) + " blocks");
  const auto np =
      lay.param_offset[static_cast<std::size_t>(s.end)] - lay.param_offset[static_cast<std::size_t>(s.begin)];
  const auto nb =
      lay.buffer_offset[static_cast<std::size_t>(s.end)] - lay.buffer_offset[static_cast<std::size_t>(s.begin)];
  if (static_cast<std::int64_t>(s.params.size()) != np || static_cast<std::int64_t>(s.buffers.size()) != nb)
    throw core::error("migrated " + blocks_str(s.begin, s.end) + " carry " + std::to_string(s.params.size()) +
                      " parameters and " + std::to_string(s.buffers.size()) + " buffer values; the model has " +
                      std::to_string(np) + " and " + std::to_string(nb));
  for (const auto& v : s.optimizer_state)
    if (static_cast<std::int64_t>(v.size()) != np)
      throw core::error("migrated optimizer state of " + blocks_str(s.begin, s.end) + " has " +
                        std::to_string(v.size()) + " values, not " + std::to_string(np));
  arrival& arr = arrivals_[device];
  bool expected = true;
  for (int i = s.begin; i < s.end; ++i) expected = expected && arr.missing.count(i) > 0;
  if (!expected) {
    if (arr.early.size() >= 64)
      throw core::error("too many migrated block ranges for device " + std::to_string(device));
    arr.early.push_back(std::move(s));  // before the re-host that expects it
    return;
  }
  apply(device, s);
  for (int i = s.begin; i < s.end; ++i) arr.missing.erase(i);
}

void segment_host::apply(std::uint32_t device, const block_state& s) {
  const auto lay = core::layout_of(*m_);
  for (auto& [key, sl] : slots_) {
    if (key.first != device) continue;
    replica& rep = *sl.rep;
    const core::stage& st = *rep.st;
    const int b = std::max(st.begin(), s.begin), e = std::min(st.end(), s.end);
    if (b >= e) continue;
    if (s.optimizer_state.size() != rep.opt->state().size())
      throw core::error(
          "migrated " + blocks_str(s.begin, s.end) + " carry " + std::to_string(s.optimizer_state.size()) +
          " optimizer state tensors; this node's optimizer has " + std::to_string(rep.opt->state().size()));
    auto copy_in = [&](const core::tensor& t, const std::vector<float>& src, const std::vector<std::int64_t>& off) {
      const auto dst0 = off[static_cast<std::size_t>(st.begin())];
      const auto src0 = off[static_cast<std::size_t>(s.begin)];
      const auto k0 = off[static_cast<std::size_t>(b)], k1 = off[static_cast<std::size_t>(e)];
      if (k0 == k1) return;
      auto v = download_all(*b_, t);
      std::copy(src.begin() + (k0 - src0), src.begin() + (k1 - src0), v.begin() + (k0 - dst0));
      b_->upload(t, v.data());
    };
    copy_in(st.params(), s.params, lay.param_offset);
    copy_in(st.buffers(), s.buffers, lay.buffer_offset);
    for (std::size_t q = 0; q < s.optimizer_state.size(); ++q)
      copy_in(rep.opt->state()[q], s.optimizer_state[q], lay.param_offset);
    rep.opt->set_steps_taken(s.optimizer_steps);
  }
}

int segment_host::n_missing(std::uint32_t device) const {
  const auto it = arrivals_.find(device);
  return it == arrivals_.end() ? 0 : static_cast<int>(it->second.missing.size());
}

bool segment_host::hosts(std::uint32_t device, int segment) const {
  return slots_.count({device, segment}) > 0;
}

bool segment_host::hosts(std::uint32_t device, const route& r, int segment) const {
  const auto it = slots_.find({device, segment});
  return it != slots_.end() && it->second.r == r;
}

segment_host::slot& segment_host::at(std::uint32_t device, int segment) {
  const auto it = slots_.find({device, segment});
  if (it == slots_.end())
    throw core::error("segment " + std::to_string(segment) + " of device " + std::to_string(device) +
                      " is not hosted here");
  return it->second;
}

core::stage& segment_host::stage_of(std::uint32_t device, int segment) {
  return *at(device, segment).rep->st;
}
core::optimizer& segment_host::optimizer_of(std::uint32_t device, int segment) {
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

segment_output segment_host::forward(std::uint32_t device, int segment, micro_batch_id id, const core::tensor& x,
                                     const core::tensor& labels, float micro_batch_scale, std::uint32_t n_micro_batches,
                                     std::uint32_t dropout_seed) {
  slot& s = at(device, segment);
  if (n_micro_batches == 0) throw core::error("a step needs at least one micro-batch");
  if (n_missing(device) > 0)
    throw core::error("device " + std::to_string(device) + ": " + std::to_string(n_missing(device)) +
                      " migrated blocks have not arrived yet");
  const core::shape& want = m_->blocks.empty() ? m_->input
                            : s.r.begin(segment) < m_->n_blocks()
                                ? m_->blocks[static_cast<std::size_t>(s.r.begin(segment))].in
                                : m_->blocks.back().out;
  if (x.shape().rank() < 1 || !(x.shape().numel_from(1) == want.numel()) || x.shape()[0] < 1)
    throw core::error("activation " + x.shape().str() + " for block " + std::to_string(s.r.begin(segment)) +
                      " does not match its input " + want.str());
  const std::int64_t batch = x.shape()[0];
  n_mb_[{device, segment}] = n_micro_batches;
  const bool loss_here = segment == s.r.loss_segment();
  core::stage::context ctx;
  core::tensor y = s.rep->st->forward(x.reshaped(want.batched(batch)), ctx, core::mode::train, dropout_seed);
  segment_output out;
  if (!loss_here) {
    s.pending[id] = {std::move(ctx), y.shape()};
    out.dir = segment_output::direction::up;
    out.value = y;
    return out;
  }
  if (!labels.defined() || labels.dtype() != core::dtype::i32 || labels.numel() != y.shape()[0])
    throw core::error("the loss of device " + std::to_string(device) + " needs " + std::to_string(y.shape()[0]) +
                      " labels");
  // Labels may come from the network: check them before any op sees them.
  std::vector<std::int32_t> lab(static_cast<std::size_t>(labels.numel()));
  b_->download(labels, lab.data());
  for (auto l : lab)
    if (l < 0 || l >= m_->n_classes) throw core::error("label " + std::to_string(l) + " out of range");
  // Sub-class targets drawn per device, step and micro-batch (the same wherever the loss runs).
  const core::tensor targets =
      m_->label_groups > 1 ? core::upload_targets(*b_, lab, m_->label_groups,
                                                  static_cast<std::uint32_t>(core::micro_batch_seed(
                                                      0, device, id.step, id.micro_batch, core::stream::label_groups)))
                           : labels;
  const core::loss_result lr = core::loss_forward(*b_, y, targets);
  std::vector<float> logits(static_cast<std::size_t>(y.numel()));
  b_->download(y, logits.data());
  if (m_->label_groups > 1) {
    const core::class_score sc = core::score_classes(logits, lab, m_->n_classes, m_->label_groups);
    out.loss = static_cast<float>(sc.loss);
    out.n_correct = static_cast<std::uint32_t>(sc.correct);
  } else {
    b_->download(lr.loss, &out.loss);
    out.n_correct = static_cast<std::uint32_t>(core::count_correct(logits, lab.data(), y.shape()[0], m_->n_classes));
  }
  core::tensor dx = s.rep->st->backward(core::loss_backward(*b_, lr, targets, micro_batch_scale), ctx, segment > 0);
  out.stepped = finish_micro_batch(s, id, n_micro_batches);
  out.dir = segment > 0 ? segment_output::direction::down : segment_output::direction::none;
  out.value = dx;
  return out;
}

segment_output segment_host::backward(std::uint32_t device, int segment, micro_batch_id id, const core::tensor& dy) {
  slot& s = at(device, segment);
  const auto it = s.pending.find(id);
  if (it == s.pending.end())
    throw core::error("gradient for step " + std::to_string(id.step) + " micro-batch " +
                      std::to_string(id.micro_batch) + " of device " + std::to_string(device) +
                      " has no forward pass here");
  const core::shape& want = it->second.out;
  if (dy.numel() != want.numel() || dy.shape().rank() < 1 || dy.shape()[0] != want[0])
    throw core::error("gradient " + dy.shape().str() + " for step " + std::to_string(id.step) + " does not match the " +
                      "activation " + want.str() + " sent up");
  segment_output out;
  core::tensor dx = s.rep->st->backward(dy.reshaped(want), it->second.ctx, segment > 0);
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

}  // namespace cleave::split
