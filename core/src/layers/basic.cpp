// Linear, convolution (grouped and depthwise too), pooling, activations (ReLU, clamp/ReLU6),
// flatten, dropout and batch-norm layers.
#include <cmath>

#include "layers.h"

namespace cleave::core::layers {

namespace {

std::int64_t batch_of(const tensor& x) {
  return x.shape()[0];
}

void require_rank(const shape& in, int rank, const char* what) {
  if (in.rank() != rank)
    throw error(std::string(what) + " expects a " + (rank == 1 ? "flat (F)" : "(C,H,W)") + " input, got " + in.str());
}

class linear final : public layer {
 public:
  linear(const shape& in, std::int64_t out, bool bias) : layer(in, shape{out}), bias_(bias) {}
  std::string kind() const override { return "linear"; }
  std::vector<param_spec> params() const override {
    std::vector<param_spec> p{{"weight", {out_[0], in_[0]}, init_kind::uniform_fan_in, in_[0]}};
    if (bias_) p.push_back({"bias", {out_[0]}, init_kind::uniform_fan_in, in_[0]});
    return p;
  }
  void bind(std::span<const tensor> p, std::span<const tensor> g, std::span<const tensor>) override {
    w_ = p[0];
    dw_ = g[0];
    if (bias_) b_ = p[1], db_ = g[1];
  }
  tensor forward(backend& b, const tensor& x, layer_ctx& ctx, const run_info&) override {
    // x (N,I) -> y (N,O)
    tensor y = b.empty({batch_of(x), out_[0]});
    b.linear_forward(x, w_, b_, y);
    ctx.saved = {x};
    return y;
  }
  tensor backward(backend& b, const tensor& dy, layer_ctx& ctx, bool need_dx) override {
    const tensor& x = ctx.saved[0];
    b.linear_backward_weights(x, dy, dw_, db_);
    if (!need_dx) return {};
    tensor dx = b.empty(x.shape());
    b.linear_backward_data(dy, w_, dx);
    return dx;
  }
  double flops_per_sample() const override { return 2.0 * static_cast<double>(in_[0] * out_[0]); }

 private:
  bool bias_;
  tensor w_, b_, dw_, db_;
};

class conv2d final : public layer {
 public:
  conv2d(const shape& in, const shape& out, int r, int s, conv2d_desc d, bool bias)
      : layer(in, out), r_(r), s_(s), d_(d), bias_(bias) {}
  std::string kind() const override { return "conv2d"; }
  std::vector<param_spec> params() const override {
    // PyTorch's fan-in of a grouped convolution: the input channels one output channel sees.
    const std::int64_t cg = in_[0] / d_.groups, fan_in = cg * r_ * s_;
    std::vector<param_spec> p{{"weight", {out_[0], cg, r_, s_}, init_kind::uniform_fan_in, fan_in}};
    if (bias_) p.push_back({"bias", {out_[0]}, init_kind::uniform_fan_in, fan_in});
    return p;
  }
  void bind(std::span<const tensor> p, std::span<const tensor> g, std::span<const tensor>) override {
    w_ = p[0];
    dw_ = g[0];
    if (bias_) b_ = p[1], db_ = g[1];
  }
  tensor forward(backend& b, const tensor& x, layer_ctx& ctx, const run_info&) override {
    // x (N,C,H,W) -> y (N,K,P,Q)
    tensor y = b.empty(out_.batched(batch_of(x)));
    b.conv2d_forward(d_, x, w_, b_, y);
    ctx.saved = {x};
    return y;
  }
  tensor backward(backend& b, const tensor& dy, layer_ctx& ctx, bool need_dx) override {
    const tensor& x = ctx.saved[0];
    b.conv2d_backward_weights(d_, x, dy, dw_, db_);
    if (!need_dx) return {};
    tensor dx = b.empty(x.shape());
    b.conv2d_backward_data(d_, dy, w_, dx);
    return dx;
  }
  double flops_per_sample() const override {
    return 2.0 * static_cast<double>(out_.numel()) * static_cast<double>(in_[0] / d_.groups * r_ * s_);
  }

 private:
  int r_, s_;
  conv2d_desc d_;
  bool bias_;
  tensor w_, b_, dw_, db_;
};

class pool2d final : public layer {
 public:
  pool2d(const shape& in, const shape& out, pool2d_desc d, bool flatten_out)
      : layer(in, out), d_(d), flatten_out_(flatten_out) {}
  std::string kind() const override {
    return flatten_out_ ? "global_avg_pool" : d_.kind == pool_kind::max ? "maxpool2d" : "avgpool2d";
  }
  tensor forward(backend& b, const tensor& x, layer_ctx& ctx, const run_info& info) override {
    // x (N,C,H,W) -> y (N,C,P,Q), or (N,C) for the global average pool
    const std::int64_t n = batch_of(x);
    const shape y4{n, in_[0], window_out(in_[1], d_.kernel_h, d_.stride_h, d_.pad_h),
                   window_out(in_[2], d_.kernel_w, d_.stride_w, d_.pad_w)};
    tensor y = b.empty(y4), ws;
    const bool train = info.mode == mode::train;
    b.pool2d_forward(d_, x, y, train ? &ws : nullptr);
    if (train) ctx.saved = {x, ws};
    return flatten_out_ ? y.reshaped({n, in_[0]}) : y;
  }
  tensor backward(backend& b, const tensor& dy, layer_ctx& ctx, bool need_dx) override {
    if (!need_dx) return {};
    const tensor &x = ctx.saved[0], &ws = ctx.saved[1];
    const std::int64_t n = batch_of(x);
    const shape y4{n, in_[0], window_out(in_[1], d_.kernel_h, d_.stride_h, d_.pad_h),
                   window_out(in_[2], d_.kernel_w, d_.stride_w, d_.pad_w)};
    tensor dx = b.empty(x.shape());
    b.pool2d_backward(d_, x, dy.reshaped(y4), ws, dx);
    return dx;
  }
  double flops_per_sample() const override { return static_cast<double>(out_.numel()) * d_.kernel_h * d_.kernel_w; }

 private:
  pool2d_desc d_;
  bool flatten_out_;
};

class relu final : public layer {
 public:
  explicit relu(const shape& in) : layer(in, in) {}
  std::string kind() const override { return "relu"; }
  tensor forward(backend& b, const tensor& x, layer_ctx& ctx, const run_info&) override {
    tensor y = b.empty(x.shape());
    b.relu_forward(x, y);
    ctx.saved = {y};
    return y;
  }
  tensor backward(backend& b, const tensor& dy, layer_ctx& ctx, bool need_dx) override {
    if (!need_dx) return {};
    tensor dx = b.empty(dy.shape());
    b.relu_backward(ctx.saved[0], dy, dx);
    return dx;
  }
  double flops_per_sample() const override { return static_cast<double>(in_.numel()); }
};

// y = min(max(x, lo), hi); ReLU6 is clamp(0, 6).
class clamp final : public layer {
 public:
  clamp(const shape& in, float lo, float hi) : layer(in, in), lo_(lo), hi_(hi) {}
  std::string kind() const override { return lo_ == 0.0f && hi_ == 6.0f ? "relu6" : "clamp"; }
  tensor forward(backend& b, const tensor& x, layer_ctx& ctx, const run_info&) override {
    tensor y = b.empty(x.shape());
    b.clamp_forward(x, y, lo_, hi_);
    ctx.saved = {y};
    return y;
  }
  tensor backward(backend& b, const tensor& dy, layer_ctx& ctx, bool need_dx) override {
    if (!need_dx) return {};
    tensor dx = b.empty(dy.shape());
    b.clamp_backward(ctx.saved[0], dy, dx, lo_, hi_);
    return dx;
  }
  double flops_per_sample() const override { return 2.0 * static_cast<double>(in_.numel()); }

 private:
  float lo_, hi_;
};

class flatten final : public layer {
 public:
  explicit flatten(const shape& in) : layer(in, shape{in.numel()}) {}
  std::string kind() const override { return "flatten"; }
  tensor forward(backend&, const tensor& x, layer_ctx&, const run_info&) override {
    return x.reshaped({batch_of(x), out_[0]});
  }
  tensor backward(backend&, const tensor& dy, layer_ctx&, bool need_dx) override {
    return need_dx ? dy.reshaped(in_.batched(batch_of(dy))) : tensor{};
  }
};

class dropout final : public layer {
 public:
  dropout(const shape& in, float p) : layer(in, in), p_(p) {}
  std::string kind() const override { return "dropout"; }
  tensor forward(backend& b, const tensor& x, layer_ctx& ctx, const run_info& info) override {
    if (info.mode == mode::eval || p_ == 0.0f) {
      ctx.saved.clear();
      return x;
    }
    tensor y = b.empty(x.shape()), mask = b.empty(x.shape());
    b.dropout_forward(x, y, mask, p_, info.seed);
    ctx.saved = {mask};
    return y;
  }
  tensor backward(backend& b, const tensor& dy, layer_ctx& ctx, bool need_dx) override {
    if (!need_dx) return {};
    if (ctx.saved.empty()) return dy;
    tensor dx = b.empty(dy.shape());
    b.mul(dy, ctx.saved[0], dx);
    return dx;
  }

 private:
  float p_;
};

class batchnorm2d final : public layer {
 public:
  batchnorm2d(const shape& in, batchnorm_desc d) : layer(in, in), d_(d) {}
  std::string kind() const override { return "batchnorm2d"; }
  std::vector<param_spec> params() const override {
    return {{"weight", {in_[0]}, init_kind::ones, 1}, {"bias", {in_[0]}, init_kind::zeros, 1}};
  }
  std::vector<param_spec> buffers() const override {
    return {{"running_mean", {in_[0]}, init_kind::zeros, 1}, {"running_var", {in_[0]}, init_kind::ones, 1}};
  }
  void bind(std::span<const tensor> p, std::span<const tensor> g, std::span<const tensor> s) override {
    gamma_ = p[0], beta_ = p[1], dgamma_ = g[0], dbeta_ = g[1], mean_ = s[0], var_ = s[1];
  }
  tensor forward(backend& b, const tensor& x, layer_ctx& ctx, const run_info& info) override {
    // x, y (N,C,H,W) or (N,C)
    tensor y = b.empty(x.shape());
    if (info.mode == mode::eval) {
      b.batchnorm_forward_infer(d_, x, gamma_, beta_, mean_, var_, y);
      return y;
    }
    tensor m = b.empty({in_[0]}), invstd = b.empty({in_[0]});
    b.batchnorm_forward_train(d_, x, gamma_, beta_, y, m, invstd, mean_, var_);
    ctx.saved = {x, m, invstd};
    return y;
  }
  tensor backward(backend& b, const tensor& dy, layer_ctx& ctx, bool) override {
    // dx is needed internally anyway; the op computes it with the parameter gradients.
    tensor dx = b.empty(dy.shape());
    b.batchnorm_backward(d_, ctx.saved[0], dy, gamma_, ctx.saved[1], ctx.saved[2], dx, dgamma_, dbeta_);
    return dx;
  }
  double flops_per_sample() const override { return 4.0 * static_cast<double>(in_.numel()); }

 private:
  batchnorm_desc d_;
  tensor gamma_, beta_, dgamma_, dbeta_, mean_, var_;
};

}  // namespace

std::unique_ptr<layer> make_linear(const shape& in, std::int64_t out_features, bool bias) {
  require_rank(in, 1, "linear");
  if (out_features < 1) throw error("out_features must be >= 1, got " + std::to_string(out_features));
  return std::make_unique<linear>(in, out_features, bias);
}

std::unique_ptr<layer> make_conv2d(const shape& in, std::int64_t out_channels, int kernel_h, int kernel_w, int stride,
                                   int padding, bool bias, int groups) {
  require_rank(in, 3, "conv2d");
  if (out_channels < 1) throw error("out_channels must be >= 1, got " + std::to_string(out_channels));
  if (groups < 1) throw error("groups must be >= 1, got " + std::to_string(groups));
  if (in[0] % groups != 0 || out_channels % groups != 0)
    throw error("groups " + std::to_string(groups) + " must divide the input channels (" + std::to_string(in[0]) +
                ") and out_channels (" + std::to_string(out_channels) + ")");
  if (kernel_h < 1 || kernel_w < 1) throw error("kernel must be >= 1");
  if (stride < 1) throw error("stride must be >= 1, got " + std::to_string(stride));
  if (padding < 0) throw error("padding must be >= 0, got " + std::to_string(padding));
  const std::int64_t p = window_out(in[1], kernel_h, stride, padding);
  const std::int64_t q = window_out(in[2], kernel_w, stride, padding);
  if (in[1] + 2 * padding < kernel_h || in[2] + 2 * padding < kernel_w || p < 1 || q < 1)
    throw error("kernel " + std::to_string(kernel_h) + "x" + std::to_string(kernel_w) + " does not fit input " +
                in.str() + " with padding " + std::to_string(padding));
  return std::make_unique<conv2d>(in, shape{out_channels, p, q}, kernel_h, kernel_w,
                                  conv2d_desc{stride, stride, padding, padding, groups}, bias);
}

std::unique_ptr<layer> make_pool2d(const shape& in, const pool2d_desc& d) {
  require_rank(in, 3, d.kind == pool_kind::max ? "maxpool2d" : "avgpool2d");
  if (d.kernel_h < 1 || d.kernel_w < 1 || d.stride_h < 1 || d.stride_w < 1)
    throw error("kernel and stride must be >= 1");
  if (d.pad_h < 0 || d.pad_w < 0 || 2 * d.pad_h > d.kernel_h || 2 * d.pad_w > d.kernel_w)
    throw error("padding must be between 0 and half the kernel");
  if (in[1] + 2 * d.pad_h < d.kernel_h || in[2] + 2 * d.pad_w < d.kernel_w)
    throw error("kernel does not fit input " + in.str());
  const shape out{in[0], window_out(in[1], d.kernel_h, d.stride_h, d.pad_h),
                  window_out(in[2], d.kernel_w, d.stride_w, d.pad_w)};
  return std::make_unique<pool2d>(in, out, d, false);
}

std::unique_ptr<layer> make_global_avg_pool(const shape& in) {
  require_rank(in, 3, "global_avg_pool");
  const auto h = static_cast<int>(in[1]), w = static_cast<int>(in[2]);
  return std::make_unique<pool2d>(in, shape{in[0]}, pool2d_desc{pool_kind::avg, h, w, h, w, 0, 0}, true);
}

std::unique_ptr<layer> make_relu(const shape& in) {
  return std::make_unique<relu>(in);
}

std::unique_ptr<layer> make_clamp(const shape& in, float lo, float hi) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || !(lo < hi))
    throw error("clamp needs finite min < max, got min " + std::to_string(lo) + ", max " + std::to_string(hi));
  return std::make_unique<clamp>(in, lo, hi);
}

std::unique_ptr<layer> make_flatten(const shape& in) {
  return std::make_unique<flatten>(in);
}

std::unique_ptr<layer> make_dropout(const shape& in, float p) {
  if (!(p >= 0.0f && p < 1.0f)) throw error("p must be in [0, 1), got " + std::to_string(p));
  return std::make_unique<dropout>(in, p);
}

std::unique_ptr<layer> make_batchnorm2d(const shape& in, float eps, float momentum) {
  if (in.rank() != 3 && in.rank() != 1) throw error("batchnorm2d expects a (C,H,W) or (C) input, got " + in.str());
  if (!(eps > 0.0f)) throw error("eps must be > 0");
  if (!(momentum >= 0.0f && momentum <= 1.0f)) throw error("momentum must be in [0, 1]");
  return std::make_unique<batchnorm2d>(in, batchnorm_desc{eps, momentum});
}

}  // namespace cleave::core::layers
