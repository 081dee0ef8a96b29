// A stage: a contiguous range of a model's blocks on one backend, with its parameters,
// gradients and state in three contiguous buffers (so a stage's weights move or average in
// one piece). The same stage code runs on every tier.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cleave/core/model.h"

namespace cleave::core {

struct named_tensor {
  std::string name;  // "3.body.0.weight": block index, then the layer's own name
  tensor value;
};

// Initial value of every parameter and state element of blocks [begin, end), computed on the
// host from the seed alone: the same on every backend and wherever the cut falls.
// params (P) and buffers (S) in the order of the blocks' params() / buffers().
void initial_values(const model_spec& m, int begin, int end, std::uint64_t seed, std::vector<float>& params,
                    std::vector<float>& buffers);

class stage {
 public:
  // Blocks [begin, end) of m on backend b, initialised from seed.
  stage(backend& b, const model_spec& m, int begin, int end, std::uint64_t seed);
  stage(const stage&) = delete;
  stage& operator=(const stage&) = delete;

  int begin() const { return begin_; }
  int end() const { return end_; }
  backend& device() const { return *b_; }
  const model_spec& model() const { return *m_; }

  // What forward keeps for backward: one per micro-batch in flight.
  struct context {
    std::vector<layer_ctx> layers;
  };

  // x (N, in...) -> y (N, out...). `seed` is this pass's randomness (see run_info).
  tensor forward(const tensor& x, context& ctx, mode md, std::uint32_t seed = 0);
  // dy (N, out...) -> dx (N, in...), accumulating parameter gradients. need_dx false skips the
  // input gradient (the first stage of a model).
  tensor backward(const tensor& dy, context& ctx, bool need_dx);

  void zero_grad();

  // Flat buffers: params (P), grads (P), buffers (S).
  const tensor& params() const { return params_; }
  const tensor& grads() const { return grads_; }
  const tensor& buffers() const { return buffers_; }
  std::int64_t n_params() const { return params_.numel(); }
  std::int64_t n_buffers() const { return buffers_.numel(); }
  std::vector<named_tensor> named_params() const;
  std::vector<named_tensor> named_buffers() const;

  // Per-block access for profiling.
  int n_blocks() const { return static_cast<int>(blocks_.size()); }
  layer& block(int i) { return *blocks_[static_cast<std::size_t>(i)]; }

 private:
  backend* b_;
  const model_spec* m_;
  int begin_, end_;
  std::vector<std::unique_ptr<layer>> blocks_;
  tensor params_, grads_, buffers_;
  std::vector<named_tensor> named_params_, named_buffers_;
};

// Softmax cross-entropy on the logits of the last block.
struct loss_result {
  tensor probs;  // (N,K)
  tensor loss;   // (1)
};
// logits (N,K), labels (N) i32 -> probs, mean loss
loss_result loss_forward(backend& b, const tensor& logits, const tensor& labels);
// -> dlogits (N,K) = d(scale * mean loss)/dlogits
tensor loss_backward(backend& b, const loss_result& r, const tensor& labels, float scale = 1.0f);

// Label groups (model_spec::label_groups = G > 1). A training step's target for sample i of
// class y[i] is sub-class y[i] * G + r_i, r_i uniform in [0, G) from hash32(seed, i): every
// sub-class of a class is trained on the same data, so the gradient of the loss points at the
// drawn sub-class as much as at the class (what a label-inference attack on it reads). out: n
// (may be y itself).
void group_targets(std::span<const std::int32_t> y, int groups, std::uint32_t seed, std::span<std::int32_t> out);
// What a step's loss targets, uploaded to b: the labels y themselves (groups 1), else their
// group_targets.
tensor upload_targets(backend& b, std::span<const std::int32_t> y, int groups, std::uint32_t seed);
// Class logits (n, classes) from logits (n, classes * groups): log-sum-exp over each group, so
// softmax over them is the sum of each group's sub-class probabilities.
void class_logits(std::span<const float> logits, std::int64_t n, int classes, int groups, std::span<float> out);
// Mean softmax cross-entropy of class logits (n, classes) against labels y, and how many rows'
// largest logit is their label's (first on ties). groups > 1: logits are (n, classes * groups),
// scored on their class_logits.
struct class_score {
  double loss = 0;
  std::int64_t correct = 0;
};
class_score score_classes(std::span<const float> logits, std::span<const std::int32_t> y, int classes, int groups = 1);

}  // namespace cleave::core
