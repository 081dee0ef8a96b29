// Optimizers over a stage's flat parameter buffer (SGD with momentum / Nesterov / weight
// decay, AdamW) and learning-rate schedules. Their state is flat too, so it migrates with
// the parameters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cleave/core/backend.h"

namespace cleave::core {

enum class optimizer_kind : std::uint8_t { sgd, adamw };
enum class schedule_kind : std::uint8_t { constant, step, cosine };

struct optimizer_config {
  optimizer_kind kind = optimizer_kind::sgd;
  float lr = 0.05f;
  float momentum = 0.9f;  // sgd
  bool nesterov = false;  // sgd
  float weight_decay = 0.0f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adamw
  schedule_kind schedule = schedule_kind::constant;
  std::int64_t step_size = 1000;  // step: lr *= gamma every step_size steps
  float gamma = 0.1f;
  std::int64_t total_steps = 0;  // cosine: anneals to min_lr over total_steps
  float min_lr = 0.0f;
  std::int64_t warmup_steps = 0;  // linear warm-up from 0 (all schedules)
};

// Parses "sgd" / "adamw" and "constant" / "step" / "cosine"; throws naming the value.
optimizer_kind parse_optimizer_kind(const std::string& s);
schedule_kind parse_schedule_kind(const std::string& s);

// The config as compact JSON (it travels in plans) and back; the parser names bad fields.
std::string to_json(const optimizer_config& c);
optimizer_config optimizer_config_from_json(const std::string& text);

// How many tensors of the parameters' size the optimizer keeps: sgd 1 (0 without momentum),
// adamw 2.
int state_tensors(const optimizer_config& c);

// Learning rate of step t (0-based) under the config's schedule.
float learning_rate(const optimizer_config& c, std::int64_t t);

class optimizer {
 public:
  // State for n_params parameters on backend b, zero-initialised.
  optimizer(backend& b, const optimizer_config& c, std::int64_t n_params);

  // params, grads (P): one update with the current step's learning rate; then step += 1.
  void step(const tensor& params, const tensor& grads);

  std::int64_t steps_taken() const { return t_; }
  void set_steps_taken(std::int64_t t) { t_ = t; }
  const optimizer_config& config() const { return c_; }
  // Replaces the base learning rate (the schedule, if any, scales it from here on).
  void set_lr(float lr);
  // Flat state tensors (P each): sgd: [momentum] (none without momentum); adamw: [m, v].
  const std::vector<tensor>& state() const { return state_; }

 private:
  backend* b_;
  optimizer_config c_;
  std::int64_t t_ = 0;
  std::vector<tensor> state_;
};

}  // namespace cleave::core
