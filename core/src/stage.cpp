// Stages: block ranges with contiguous parameter storage, forward and backward.
#include "cleave/core/stage.h"

#include <algorithm>
#include <cmath>

#include "cleave/core/random.h"

namespace cleave::core {

namespace {

void fill_init(const param_spec& p, std::uint64_t stream, std::vector<float>& out) {
  const auto n = static_cast<std::size_t>(p.shape.numel());
  switch (p.init) {
    case init_kind::zeros:
      out.insert(out.end(), n, 0.0f);
      break;
    case init_kind::ones:
      out.insert(out.end(), n, 1.0f);
      break;
    case init_kind::uniform_fan_in: {
      const float bound = 1.0f / std::sqrt(static_cast<float>(p.fan_in));
      rng r(stream);
      for (std::size_t i = 0; i < n; ++i) out.push_back(r.uniform(-bound, bound));
      break;
    }
  }
}

// One random stream per (seed, block, parameter).
std::uint64_t stream_of(std::uint64_t seed, int block, std::size_t index, bool is_buffer) {
  return mix64(mix64(seed) ^ mix64((static_cast<std::uint64_t>(block) << 20) ^ (index << 1) ^ (is_buffer ? 1 : 0)));
}

}  // namespace

void initial_values(const model_spec& m, int begin, int end, std::uint64_t seed, std::vector<float>& params,
                    std::vector<float>& buffers) {
  params.clear();
  buffers.clear();
  auto blocks = build_blocks(m, begin, end);
  for (int i = begin; i < end; ++i) {
    const layer& l = *blocks[static_cast<std::size_t>(i - begin)];
    const auto ps = l.params(), bs = l.buffers();
    for (std::size_t j = 0; j < ps.size(); ++j) fill_init(ps[j], stream_of(seed, i, j, false), params);
    for (std::size_t j = 0; j < bs.size(); ++j) fill_init(bs[j], stream_of(seed, i, j, true), buffers);
  }
}

stage::stage(backend& b, const model_spec& m, int begin, int end, std::uint64_t seed)
    : b_(&b), m_(&m), begin_(begin), end_(end), blocks_(build_blocks(m, begin, end)) {
  std::vector<float> p0, s0;
  initial_values(m, begin, end, seed, p0, s0);
  params_ = b.empty({static_cast<std::int64_t>(p0.size())});
  grads_ = b.zeros({static_cast<std::int64_t>(p0.size())});
  buffers_ = b.empty({static_cast<std::int64_t>(s0.size())});
  b.upload(params_, p0.data());
  b.upload(buffers_, s0.data());
  std::size_t po = 0, so = 0;
  for (int i = begin; i < end; ++i) {
    layer& l = *blocks_[static_cast<std::size_t>(i - begin)];
    std::vector<tensor> pv, gv, sv;
    for (const auto& p : l.params()) {
      pv.push_back(params_.view(po * 4, p.shape, dtype::f32));
      gv.push_back(grads_.view(po * 4, p.shape, dtype::f32));
      named_params_.push_back({std::to_string(i) + "." + p.name, pv.back()});
      po += static_cast<std::size_t>(p.shape.numel());
    }
    for (const auto& s : l.buffers()) {
      sv.push_back(buffers_.view(so * 4, s.shape, dtype::f32));
      named_buffers_.push_back({std::to_string(i) + "." + s.name, sv.back()});
      so += static_cast<std::size_t>(s.shape.numel());
    }
    l.bind(pv, gv, sv);
  }
}

tensor stage::forward(const tensor& x, context& ctx, mode md, std::uint32_t seed) {
  ctx.layers.resize(blocks_.size());
  tensor h = x;
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const run_info info{md, hash32(seed, static_cast<std::uint32_t>(begin_) + static_cast<std::uint32_t>(i))};
    h = blocks_[i]->forward(*b_, h, ctx.layers[i], info);
    // No backward follows an evaluation: what a block kept for one goes at once, so only a
    // block's input and output are alive, not every activation of the stage.
    if (md == mode::eval) ctx.layers[i] = {};
  }
  return h;
}

tensor stage::backward(const tensor& dy, context& ctx, bool need_dx) {
  CLEAVE_ASSERT(ctx.layers.size() == blocks_.size(), "backward without a matching forward");
  tensor d = dy;
  for (std::size_t i = blocks_.size(); i-- > 0;) {
    d = blocks_[i]->backward(*b_, d, ctx.layers[i], need_dx || i > 0);
    ctx.layers[i] = {};  // free what forward kept as soon as it is used
  }
  return d;
}

void stage::zero_grad() {
  if (grads_.numel()) b_->fill(grads_, 0.0f);
}

std::vector<named_tensor> stage::named_params() const {
  return named_params_;
}
std::vector<named_tensor> stage::named_buffers() const {
  return named_buffers_;
}

loss_result loss_forward(backend& b, const tensor& logits, const tensor& labels) {
  loss_result r{b.empty(logits.shape()), b.empty({1})};
  b.softmax_xent_forward(logits, labels, r.probs, r.loss);
  return r;
}

tensor loss_backward(backend& b, const loss_result& r, const tensor& labels, float scale) {
  tensor d = b.empty(r.probs.shape());
  b.softmax_xent_backward(r.probs, labels, d, scale);
  return d;
}

void group_targets(std::span<const std::int32_t> y, int groups, std::uint32_t seed, std::span<std::int32_t> out) {
  if (groups < 1 || out.size() != y.size())
    throw error("group_targets: " + std::to_string(y.size()) + " labels, " + std::to_string(out.size()) + " targets, " +
                std::to_string(groups) + " groups");
  for (std::size_t i = 0; i < y.size(); ++i)
    out[i] = y[i] * groups + static_cast<std::int32_t>(hash32(seed, static_cast<std::uint32_t>(i)) %
                                                       static_cast<std::uint32_t>(groups));
}

tensor upload_targets(backend& b, std::span<const std::int32_t> y, int groups, std::uint32_t seed) {
  tensor t = b.empty({static_cast<std::int64_t>(y.size())}, dtype::i32);
  if (groups == 1) {
    b.upload(t, y.data());
    return t;
  }
  std::vector<std::int32_t> drawn(y.size());
  group_targets(y, groups, seed, drawn);
  b.upload(t, drawn.data());
  return t;
}

void class_logits(std::span<const float> logits, std::int64_t n, int classes, int groups, std::span<float> out) {
  const std::int64_t k = static_cast<std::int64_t>(classes) * groups;
  if (n < 0 || classes < 1 || groups < 1 || logits.size() != static_cast<std::size_t>(n * k) ||
      out.size() != static_cast<std::size_t>(n * classes))
    throw error("class_logits: " + std::to_string(logits.size()) + " logits, " + std::to_string(out.size()) +
                " outputs do not make " + std::to_string(n) + " rows of " + std::to_string(classes) + " classes x " +
                std::to_string(groups) + " groups");
  for (std::int64_t i = 0; i < n * classes; ++i) {
    const float* g = logits.data() + i * groups;
    const float top = *std::max_element(g, g + groups);
    double s = 0;
    for (int j = 0; j < groups; ++j) s += std::exp(static_cast<double>(g[j]) - top);
    out[static_cast<std::size_t>(i)] = static_cast<float>(top + std::log(s));
  }
}

class_score score_classes(std::span<const float> logits, std::span<const std::int32_t> y, int classes, int groups) {
  const std::int64_t n = static_cast<std::int64_t>(y.size());
  if (groups > 1) {
    std::vector<float> cl(static_cast<std::size_t>(n) * static_cast<std::size_t>(std::max(classes, 0)));
    class_logits(logits, n, classes, groups, cl);
    return score_classes(cl, y, classes);
  }
  if (classes < 1 || logits.size() != static_cast<std::size_t>(n * classes))
    throw error("score_classes: " + std::to_string(logits.size()) + " logits for " + std::to_string(n) + " labels of " +
                std::to_string(classes) + " classes");
  class_score r;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = logits.data() + i * classes;
    const std::int32_t label = y[static_cast<std::size_t>(i)];
    if (label < 0 || label >= classes) throw error("score_classes: label " + std::to_string(label) + " out of range");
    const float* best = std::max_element(row, row + classes);
    double s = 0;
    for (int j = 0; j < classes; ++j) s += std::exp(static_cast<double>(row[j]) - *best);
    r.loss += static_cast<double>(*best) + std::log(s) - row[label];
    r.correct += best - row == label;
  }
  if (n > 0) r.loss /= static_cast<double>(n);
  return r;
}

}  // namespace cleave::core
