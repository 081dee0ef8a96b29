// Optimizer steps and learning-rate schedules.
#include "cleave/core/optimizer.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace cleave::core {

optimizer_kind parse_optimizer_kind(const std::string& s) {
  if (s == "sgd") return optimizer_kind::sgd;
  if (s == "adamw") return optimizer_kind::adamw;
  throw error("unknown optimizer '" + s + "' (known: sgd, adamw)");
}

schedule_kind parse_schedule_kind(const std::string& s) {
  if (s == "constant") return schedule_kind::constant;
  if (s == "step") return schedule_kind::step;
  if (s == "cosine") return schedule_kind::cosine;
  throw error("unknown learning-rate schedule '" + s + "' (known: constant, step, cosine)");
}

std::string to_json(const optimizer_config& c) {
  nlohmann::json j = {{"optimizer", c.kind == optimizer_kind::sgd ? "sgd" : "adamw"},
                      {"lr", c.lr},
                      {"momentum", c.momentum},
                      {"nesterov", c.nesterov},
                      {"weight_decay", c.weight_decay},
                      {"beta1", c.beta1},
                      {"beta2", c.beta2},
                      {"eps", c.eps},
                      {"schedule", c.schedule == schedule_kind::constant ? "constant"
                                   : c.schedule == schedule_kind::step   ? "step"
                                                                         : "cosine"},
                      {"step_size", c.step_size},
                      {"gamma", c.gamma},
                      {"total_steps", c.total_steps},
                      {"min_lr", c.min_lr},
                      {"warmup_steps", c.warmup_steps}};
  return j.dump();
}

optimizer_config optimizer_config_from_json(const std::string& text) {
  optimizer_config c;
  try {
    const auto j = nlohmann::json::parse(text);
    c.kind = parse_optimizer_kind(j.at("optimizer").get<std::string>());
    c.lr = j.at("lr").get<float>();
    c.momentum = j.at("momentum").get<float>();
    c.nesterov = j.at("nesterov").get<bool>();
    c.weight_decay = j.at("weight_decay").get<float>();
    c.beta1 = j.at("beta1").get<float>();
    c.beta2 = j.at("beta2").get<float>();
    c.eps = j.at("eps").get<float>();
    c.schedule = parse_schedule_kind(j.at("schedule").get<std::string>());
    c.step_size = j.at("step_size").get<std::int64_t>();
    c.gamma = j.at("gamma").get<float>();
    c.total_steps = j.at("total_steps").get<std::int64_t>();
    c.min_lr = j.at("min_lr").get<float>();
    c.warmup_steps = j.at("warmup_steps").get<std::int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw error(std::string("optimizer settings: ") + e.what());
  }
  if (!(c.lr >= 0.0f) || !(c.momentum >= 0.0f && c.momentum <= 1.0f)) throw error("optimizer settings: out of range");
  return c;
}

float learning_rate(const optimizer_config& c, std::int64_t t) {
  if (c.warmup_steps > 0 && t < c.warmup_steps)
    return c.lr * static_cast<float>(t + 1) / static_cast<float>(c.warmup_steps);
  const std::int64_t u = t - c.warmup_steps;
  switch (c.schedule) {
    case schedule_kind::constant:
      return c.lr;
    case schedule_kind::step:
      return c.lr * std::pow(c.gamma, static_cast<float>(c.step_size > 0 ? u / c.step_size : 0));
    case schedule_kind::cosine: {
      const std::int64_t span = std::max<std::int64_t>(1, c.total_steps - c.warmup_steps);
      const double frac = std::min(1.0, static_cast<double>(u) / static_cast<double>(span));
      return static_cast<float>(c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(3.141592653589793 * frac)));
    }
  }
  return c.lr;
}

int state_tensors(const optimizer_config& c) {
  if (c.kind == optimizer_kind::adamw) return 2;
  return c.momentum != 0.0f ? 1 : 0;
}

optimizer::optimizer(backend& b, const optimizer_config& c, std::int64_t n_params) : b_(&b), c_(c) {
  if (!(c.lr >= 0.0f)) throw error("learning rate must be >= 0");
  const shape s{n_params};
  for (int i = 0; i < state_tensors(c); ++i) state_.push_back(b.zeros(s));
}

void optimizer::set_lr(float lr) {
  if (!(lr >= 0.0f) || !std::isfinite(lr)) throw error("learning rate must be finite and >= 0");
  c_.lr = lr;
}

void optimizer::step(const tensor& params, const tensor& grads) {
  const float lr = learning_rate(c_, t_);
  ++t_;
  if (params.numel() == 0) return;
  if (c_.kind == optimizer_kind::sgd) {
    b_->sgd_update({lr, c_.momentum, c_.weight_decay, c_.nesterov}, params, grads,
                   state_.empty() ? tensor{} : state_[0]);
  } else {
    b_->adamw_update({lr, c_.beta1, c_.beta2, c_.eps, c_.weight_decay, t_}, params, grads, state_[0], state_[1]);
  }
}

}  // namespace cleave::core
