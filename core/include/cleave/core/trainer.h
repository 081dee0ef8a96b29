// Local training: one stage holding the whole model on one backend, an optimizer, and the
// loops over a data set (shuffled per epoch from the seed) with progress and evaluation.
#pragma once

#include <functional>
#include <memory>

#include "cleave/core/dataset.h"
#include "cleave/core/optimizer.h"
#include "cleave/core/stage.h"

namespace cleave::core {

struct train_config {
  int batch = 64;
  int epochs = 1;
  std::uint64_t seed = 1;        // initial weights (and data order unless order_seed is set)
  std::uint64_t order_seed = 0;  // data order; 0: seed
  optimizer_config opt;
  // Images per evaluation batch. 128 rather than larger: MobileNetV2 on 28x28 at 500 had its
  // peak RSS at 2.1 GB (its expanded activations are 0.2 GB each at 500), at 128 1.0 GB, and
  // evaluated 10,000 images faster (25.4 s against 28.6 s for 5 steps and the evaluation).
  int eval_batch = 128;
  int report_every = 50;        // steps between progress reports
  std::int64_t max_steps = -1;  // stop an epoch early (benchmarks, tests); -1: whole epochs
  // Augmentation of the training batches, drawn with the data-order seed; evaluation never
  // augments.
  augment_config augment;
};

struct progress_report {
  int epoch = 0;          // 0-based
  std::int64_t step = 0;  // steps done in this epoch
  std::int64_t steps_per_epoch = 0;
  float loss = 0.0f;          // mean training loss since the last report
  double images_per_s = 0.0;  // since the epoch started
  double lr = 0.0;
};

struct eval_report {
  double loss = 0.0;
  double accuracy = 0.0;
  std::int64_t n = 0;
};

// Optimizer steps of one epoch over n samples (cut at max_steps when it is set).
std::int64_t steps_per_epoch(std::int64_t n_samples, const train_config& c);
// Spans the learning-rate schedule over the run: cosine over every step of every epoch, step
// decaying once per epoch.
void fit_schedule(train_config& c, std::int64_t n_samples);

class trainer {
 public:
  trainer(backend& b, const model_spec& m, const train_config& c);

  stage& model_stage() { return *stage_; }
  optimizer& opt() { return *opt_; }
  const train_config& config() const { return c_; }

  // One optimizer step on a host batch: x (n, item...), y (n). Returns the loss tensor (1)
  // without waiting for it.
  tensor step(const float* x, const std::int32_t* y, std::int64_t n);
  // One epoch in the seeded order for `epoch` over any source (a loaded core::dataset or an
  // app's own); calls `progress` every report_every steps and at the end. Returns the number of
  // images trained on.
  std::int64_t train_epoch(const data_source& d, int epoch,
                           const std::function<void(const progress_report&)>& progress);
  // The whole source in its order, in batches of eval_batch, never augmented.
  eval_report evaluate(const data_source& d);

 private:
  backend* b_;
  train_config c_;
  std::unique_ptr<stage> stage_;
  std::unique_ptr<optimizer> opt_;
  std::int64_t samples_seen_ = 0;
};

// Index of the largest of each row: logits (n, k) on the host.
std::int64_t count_correct(const std::vector<float>& logits, const std::int32_t* labels, std::int64_t n,
                           std::int64_t k);

}  // namespace cleave::core
