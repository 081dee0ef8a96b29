// The local training loop.
#include "cleave/core/trainer.h"

#include <chrono>

#include "cleave/core/random.h"

namespace cleave::core {

trainer::trainer(backend& b, const model_spec& m, const train_config& c)
    : b_(&b),
      c_(c),
      stage_(std::make_unique<stage>(b, m, 0, m.n_blocks(), c.seed)),
      opt_(std::make_unique<optimizer>(b, c.opt, stage_->n_params())) {
  if (c.batch < 1) throw error("batch size must be >= 1, got " + std::to_string(c.batch));
  if (c.epochs < 0) throw error("epochs must be >= 0");
}

tensor trainer::step(const float* x, const std::int32_t* y, std::int64_t n) {
  const model_spec& m = stage_->model();
  const shape xs = m.input.batched(n);
  tensor xt = b_->empty(xs);
  b_->upload(xt, x);
  const std::span<const std::int32_t> labels{y, static_cast<std::size_t>(n)};
  stage::context ctx;
  // Dropout seed from the global sample position: identical wherever the blocks run.
  const auto seed = hash32(static_cast<std::uint32_t>(c_.seed), static_cast<std::uint32_t>(samples_seen_));
  // Under label groups each sample's target is a sub-class of its class drawn from the step's seed.
  const tensor yt = upload_targets(*b_, labels, m.label_groups, hash32(seed, 0x6c61626cu));
  samples_seen_ += n;
  stage_->zero_grad();
  tensor logits = stage_->forward(xt, ctx, mode::train, seed);
  const loss_result lr = loss_forward(*b_, logits, yt);
  stage_->backward(loss_backward(*b_, lr, yt), ctx, false);
  opt_->step(stage_->params(), stage_->grads());
  if (m.label_groups == 1) return lr.loss;
  // The loss reported is the class loss (the sub-class one is log G higher at best).
  std::vector<float> all(static_cast<std::size_t>(logits.numel()));
  b_->download(logits, all.data());
  const float l = static_cast<float>(score_classes(all, labels, m.n_classes, m.label_groups).loss);
  tensor out = b_->empty({1});
  b_->upload(out, &l);
  return out;
}

std::int64_t steps_per_epoch(std::int64_t n_samples, const train_config& c) {
  const std::int64_t steps = (n_samples + c.batch - 1) / c.batch;
  return c.max_steps >= 0 ? std::min(steps, c.max_steps) : steps;
}

void fit_schedule(train_config& c, std::int64_t n_samples) {
  const std::int64_t per_epoch = steps_per_epoch(n_samples, c);
  c.opt.total_steps = per_epoch * c.epochs;
  c.opt.step_size = per_epoch;
}

std::int64_t trainer::train_epoch(const data_source& d, int epoch,
                                  const std::function<void(const progress_report&)>& progress) {
  const std::uint64_t order_seed = c_.order_seed ? c_.order_seed : c_.seed;
  const auto order = epoch_order(d.size(), order_seed, epoch);
  const std::int64_t per = d.sample_shape().numel();
  const std::int64_t steps = steps_per_epoch(d.size(), c_);
  std::vector<float> xb(static_cast<std::size_t>(c_.batch * per));
  std::vector<std::int32_t> yb(static_cast<std::size_t>(c_.batch));
  tensor loss_sum = b_->zeros({1});
  std::int64_t since_report = 0, images = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t s = 0; s < steps; ++s) {
    const std::int64_t first = s * c_.batch;
    const std::int64_t n = std::min<std::int64_t>(c_.batch, d.size() - first);
    d.fetch_augmented(order.data() + first, n, xb.data(), yb.data(), c_.augment, order_seed, epoch);
    const float lr_now = learning_rate(c_.opt, opt_->steps_taken());
    tensor loss = step(xb.data(), yb.data(), n);
    b_->axpy(1.0f, loss, loss_sum);
    images += n;
    ++since_report;
    if (progress && (since_report == c_.report_every || s + 1 == steps)) {
      float sum = 0.0f;
      b_->download(loss_sum, &sum);
      b_->fill(loss_sum, 0.0f);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      progress({epoch, s + 1, steps, sum / static_cast<float>(since_report),
                secs > 0 ? static_cast<double>(images) / secs : 0.0, lr_now});
      since_report = 0;
    }
  }
  b_->synchronize();
  return images;
}

std::int64_t count_correct(const std::vector<float>& logits, const std::int32_t* labels, std::int64_t n,
                           std::int64_t k) {
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = logits.data() + i * k;
    std::int64_t best = 0;
    for (std::int64_t j = 1; j < k; ++j)
      if (row[j] > row[best]) best = j;
    correct += best == labels[i];
  }
  return correct;
}

eval_report trainer::evaluate(const data_source& d) {
  const model_spec& m = stage_->model();
  const std::int64_t per = d.sample_shape().numel(), k = m.n_classes;
  eval_report r;
  std::vector<std::int64_t> idx(static_cast<std::size_t>(c_.eval_batch));
  std::vector<float> xb(static_cast<std::size_t>(c_.eval_batch * per)), logits;
  std::vector<std::int32_t> yb(static_cast<std::size_t>(c_.eval_batch));
  double loss_total = 0.0;
  std::int64_t correct = 0;
  // Evaluation allocates other sizes than a training step: the blocks kept for the steps go
  // first, and the evaluation's after it, so the process holds one phase's memory at a time.
  b_->release_cached_memory();
  for (std::int64_t first = 0; first < d.size(); first += c_.eval_batch) {
    const std::int64_t n = std::min<std::int64_t>(c_.eval_batch, d.size() - first);
    for (std::int64_t i = 0; i < n; ++i) idx[static_cast<std::size_t>(i)] = first + i;
    d.fetch(idx.data(), n, xb.data(), yb.data());
    const shape xs = m.input.batched(n);
    tensor xt = b_->empty(xs);
    b_->upload(xt, xb.data());
    stage::context ctx;
    tensor out = stage_->forward(xt, ctx, mode::eval);
    logits.resize(static_cast<std::size_t>(out.numel()));
    b_->download(out, logits.data());
    if (m.label_groups > 1) {
      // Scored on the class logits, on the host (what a training step reports too).
      const class_score sc =
          score_classes(logits, {yb.data(), static_cast<std::size_t>(n)}, m.n_classes, m.label_groups);
      loss_total += sc.loss * static_cast<double>(n);
      correct += sc.correct;
    } else {
      const tensor yt = upload_targets(*b_, {yb.data(), static_cast<std::size_t>(n)}, 1, 0);
      const loss_result lr = loss_forward(*b_, out, yt);
      float l = 0.0f;
      b_->download(lr.loss, &l);
      loss_total += static_cast<double>(l) * static_cast<double>(n);
      correct += count_correct(logits, yb.data(), n, k);
    }
    r.n += n;
  }
  b_->release_cached_memory();
  if (r.n) {
    r.loss = loss_total / static_cast<double>(r.n);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(r.n);
  }
  return r;
}

}  // namespace cleave::core
