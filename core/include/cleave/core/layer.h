// Layers and blocks: the forward/backward contract every block of a model follows.
// A block is one layer or a composite (residual) with an inside graph; cuts fall between blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cleave/core/backend.h"

namespace cleave::core {

enum class mode : std::uint8_t { train, eval };

// What a forward pass needs to know besides its input.
struct run_info {
  core::mode mode = core::mode::train;
  // Seed of this pass's randomness (dropout); derived from the model seed, the block and the
  // global sample position so it is the same wherever the block runs.
  std::uint32_t seed = 0;
};

// How a parameter or state buffer starts.
enum class init_kind : std::uint8_t {
  zeros,
  ones,
  uniform_fan_in,  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's default for weights and biases
};

struct param_spec {
  std::string name;  // "weight", "bias", "running_mean"
  core::shape shape;
  init_kind init = init_kind::zeros;
  std::int64_t fan_in = 1;
};

// What forward keeps for backward (one per layer per micro-batch).
struct layer_ctx {
  std::vector<tensor> saved;
  std::vector<layer_ctx> children;  // composites: one per inner layer
};

class layer {
 public:
  virtual ~layer() = default;

  virtual std::string kind() const = 0;
  // Per-sample shapes, without the batch dimension: (C,H,W) or (F).
  const shape& input_shape() const { return in_; }
  const shape& output_shape() const { return out_; }

  // Trainable parameters and non-trainable state (e.g. running statistics), in a fixed order.
  virtual std::vector<param_spec> params() const { return {}; }
  virtual std::vector<param_spec> buffers() const { return {}; }
  // Binds the tensors this layer works on: views into its stage's contiguous buffers, in the
  // order of params() / buffers(). grads has the shapes of params.
  virtual void bind(std::span<const tensor> params, std::span<const tensor> grads, std::span<const tensor> buffers) {}

  // x (N, input_shape...) -> y (N, output_shape...); keeps in ctx what backward needs.
  virtual tensor forward(backend& b, const tensor& x, layer_ctx& ctx, const run_info& info) = 0;
  // dy (N, output_shape...) -> dx (N, input_shape...); accumulates (+=) parameter gradients.
  // need_dx false lets the first block skip computing the input gradient.
  virtual tensor backward(backend& b, const tensor& dy, layer_ctx& ctx, bool need_dx) = 0;

  // Floating-point operations of forward for one sample (for profiles and benchmarks).
  virtual double flops_per_sample() const { return 0.0; }

 protected:
  layer(shape in, shape out) : in_(in), out_(out) {}
  shape in_, out_;
};

}  // namespace cleave::core
