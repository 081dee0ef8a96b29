// Two small networks built straight on core::backend ops for the CUDA benchmark: LeNet-5 and a
// ResNet-8 (three basic blocks) for 32x32 images. One training step = forward, loss, backward
// (parameter gradients accumulate); the same seed gives the same weights on every backend.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cleave/core/backend.h"
#include "cleave/core/random.h"

namespace cleave::bench {

using core::backend;
using core::shape;
using core::tensor;

inline tensor uniform(backend& b, const shape& s, float bound, std::uint64_t seed) {
  core::rng r(seed);
  std::vector<float> v(static_cast<std::size_t>(s.numel()));
  for (auto& x : v) x = r.uniform(-bound, bound);
  tensor t = b.empty(s);
  b.upload(t, v.data());
  return t;
}

class layer {
 public:
  virtual ~layer() = default;
  virtual tensor forward(backend& b, const tensor& x) = 0;
  virtual tensor backward(backend& b, const tensor& dy) = 0;  // returns dx
};

class conv final : public layer {
 public:
  // w (k,c,r,r), optional bias (k)
  conv(backend& b, std::int64_t c, std::int64_t k, int r, int stride, int pad, bool bias, std::uint64_t seed)
      : d_{stride, stride, pad, pad} {
    const float bound = 1.0f / std::sqrt(static_cast<float>(c * r * r));
    w_ = uniform(b, {k, c, r, r}, bound, seed);
    dw_ = b.zeros(w_.shape());
    if (bias) {
      bias_ = uniform(b, {k}, bound, seed + 1);
      db_ = b.zeros({k});
    }
  }
  tensor forward(backend& b, const tensor& x) override {
    x_ = x;
    const auto& s = x.shape();
    const std::int64_t r = w_.shape()[2];
    tensor y = b.empty({s[0], w_.shape()[0], core::window_out(s[2], static_cast<int>(r), d_.stride_h, d_.pad_h),
                        core::window_out(s[3], static_cast<int>(r), d_.stride_w, d_.pad_w)});
    b.conv2d_forward(d_, x, w_, bias_, y);
    return y;
  }
  tensor backward(backend& b, const tensor& dy) override {
    b.conv2d_backward_weights(d_, x_, dy, dw_, db_);
    tensor dx = b.empty(x_.shape());
    b.conv2d_backward_data(d_, dy, w_, dx);
    return dx;
  }

 private:
  core::conv2d_desc d_;
  tensor w_, bias_, dw_, db_, x_;
};

class linear final : public layer {
 public:
  // w (out,in), b (out); x (N, ...) is flattened to (N, in)
  linear(backend& b, std::int64_t in, std::int64_t out, std::uint64_t seed) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(in));
    w_ = uniform(b, {out, in}, bound, seed);
    bias_ = uniform(b, {out}, bound, seed + 1);
    dw_ = b.zeros(w_.shape());
    db_ = b.zeros({out});
  }
  tensor forward(backend& b, const tensor& x) override {
    x_ = x.reshaped({x.shape()[0], w_.shape()[1]});
    in_shape_ = x.shape();
    tensor y = b.empty({x.shape()[0], w_.shape()[0]});
    b.linear_forward(x_, w_, bias_, y);
    return y;
  }
  tensor backward(backend& b, const tensor& dy) override {
    b.linear_backward_weights(x_, dy, dw_, db_);
    tensor dx = b.empty(x_.shape());
    b.linear_backward_data(dy, w_, dx);
    return dx.reshaped(in_shape_);
  }

 private:
  tensor w_, bias_, dw_, db_, x_;
  shape in_shape_;
};

class relu final : public layer {
 public:
  tensor forward(backend& b, const tensor& x) override {
    y_ = b.empty(x.shape());
    b.relu_forward(x, y_);
    return y_;
  }
  tensor backward(backend& b, const tensor& dy) override {
    tensor dx = b.empty(dy.shape());
    b.relu_backward(y_, dy, dx);
    return dx;
  }

 private:
  tensor y_;
};

class pool final : public layer {
 public:
  explicit pool(core::pool2d_desc d) : d_(d) {}
  tensor forward(backend& b, const tensor& x) override {
    x_ = x;
    const auto& s = x.shape();
    tensor y = b.empty({s[0], s[1], core::window_out(s[2], d_.kernel_h, d_.stride_h, d_.pad_h),
                        core::window_out(s[3], d_.kernel_w, d_.stride_w, d_.pad_w)});
    b.pool2d_forward(d_, x, y, &ws_);
    return y;
  }
  tensor backward(backend& b, const tensor& dy) override {
    tensor dx = b.empty(x_.shape());
    b.pool2d_backward(d_, x_, dy, ws_, dx);
    return dx;
  }

 private:
  core::pool2d_desc d_;
  tensor x_, ws_;
};

class batchnorm final : public layer {
 public:
  batchnorm(backend& b, std::int64_t c) {
    gamma_ = b.empty({c});
    b.fill(gamma_, 1.0f);
    beta_ = b.zeros({c});
    rm_ = b.zeros({c});
    rv_ = b.empty({c});
    b.fill(rv_, 1.0f);
    mean_ = b.empty({c});
    invstd_ = b.empty({c});
    dg_ = b.zeros({c});
    db_ = b.zeros({c});
  }
  tensor forward(backend& b, const tensor& x) override {
    x_ = x;
    tensor y = b.empty(x.shape());
    b.batchnorm_forward_train({}, x, gamma_, beta_, y, mean_, invstd_, rm_, rv_);
    return y;
  }
  tensor backward(backend& b, const tensor& dy) override {
    tensor dx = b.empty(x_.shape());
    b.batchnorm_backward({}, x_, dy, gamma_, mean_, invstd_, dx, dg_, db_);
    return dx;
  }

 private:
  tensor gamma_, beta_, rm_, rv_, mean_, invstd_, dg_, db_, x_;
};

class sequential final : public layer {
 public:
  sequential& add(std::unique_ptr<layer> l) {
    layers_.push_back(std::move(l));
    return *this;
  }
  tensor forward(backend& b, const tensor& x) override {
    tensor h = x;
    for (auto& l : layers_) h = l->forward(b, h);
    return h;
  }
  tensor backward(backend& b, const tensor& dy) override {
    tensor g = dy;
    for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) g = (*it)->backward(b, g);
    return g;
  }
  bool empty() const { return layers_.empty(); }

 private:
  std::vector<std::unique_ptr<layer>> layers_;
};

// relu(main(x) + shortcut(x)); the shortcut is the identity or a strided 1x1 conv + bn.
class basic_block final : public layer {
 public:
  basic_block(backend& b, std::int64_t c_in, std::int64_t c_out, int stride, std::uint64_t seed) {
    main_.add(std::make_unique<conv>(b, c_in, c_out, 3, stride, 1, false, seed))
        .add(std::make_unique<batchnorm>(b, c_out))
        .add(std::make_unique<relu>())
        .add(std::make_unique<conv>(b, c_out, c_out, 3, 1, 1, false, seed + 10))
        .add(std::make_unique<batchnorm>(b, c_out));
    if (stride != 1 || c_in != c_out)
      shortcut_.add(std::make_unique<conv>(b, c_in, c_out, 1, stride, 0, false, seed + 20))
          .add(std::make_unique<batchnorm>(b, c_out));
  }
  tensor forward(backend& b, const tensor& x) override {
    tensor m = main_.forward(b, x);
    tensor s = shortcut_.empty() ? x : shortcut_.forward(b, x);
    tensor sum = b.empty(m.shape());
    b.add(m, s, sum);
    return out_.forward(b, sum);
  }
  tensor backward(backend& b, const tensor& dy) override {
    tensor dsum = out_.backward(b, dy);
    tensor dx = main_.backward(b, dsum);
    if (shortcut_.empty()) {
      b.add(dx, dsum, dx);
    } else {
      tensor ds = shortcut_.backward(b, dsum);
      b.add(dx, ds, dx);
    }
    return dx;
  }

 private:
  sequential main_, shortcut_;
  relu out_;
};

// A network with its input batch, labels and softmax cross-entropy head.
struct net {
  std::string name;
  shape input;
  std::int64_t n_classes = 10;
  sequential body;
  tensor x, labels, probs, loss, dlogits;

  void prepare(backend& b, std::uint64_t seed) {
    x = uniform(b, input, 1.0f, seed);
    std::vector<std::int32_t> lab(static_cast<std::size_t>(input[0]));
    for (std::size_t i = 0; i < lab.size(); ++i) lab[i] = static_cast<std::int32_t>(i % n_classes);
    labels = b.empty({input[0]}, core::dtype::i32);
    b.upload(labels, lab.data());
    probs = b.empty({input[0], n_classes});
    loss = b.empty({1});
    dlogits = b.empty({input[0], n_classes});
  }
  // One forward + backward pass; returns nothing (the caller synchronises to time it).
  void step(backend& b) {
    tensor logits = body.forward(b, x);
    b.softmax_xent_forward(logits, labels, probs, loss);
    b.softmax_xent_backward(probs, labels, dlogits, 1.0f);
    body.backward(b, dlogits);
  }
};

// LeNet-5 on (n,1,28,28): conv 6@5x5 pad 2, max pool, conv 16@5x5, max pool, fc 120, 84, 10.
inline std::unique_ptr<net> make_lenet5(backend& b, std::int64_t n) {
  auto m = std::make_unique<net>();
  m->name = "lenet5";
  m->input = {n, 1, 28, 28};
  const core::pool2d_desc p2{core::pool_kind::max, 2, 2, 2, 2, 0, 0};
  m->body.add(std::make_unique<conv>(b, 1, 6, 5, 1, 2, true, 1))
      .add(std::make_unique<relu>())
      .add(std::make_unique<pool>(p2))
      .add(std::make_unique<conv>(b, 6, 16, 5, 1, 0, true, 3))
      .add(std::make_unique<relu>())
      .add(std::make_unique<pool>(p2))
      .add(std::make_unique<linear>(b, 400, 120, 5))
      .add(std::make_unique<relu>())
      .add(std::make_unique<linear>(b, 120, 84, 7))
      .add(std::make_unique<relu>())
      .add(std::make_unique<linear>(b, 84, 10, 9));
  m->prepare(b, 11);
  return m;
}

// ResNet-8 on (n,3,32,32): conv 16@3x3 + bn + relu, basic blocks 16, 32/2, 64/2, global
// average pool, fc 10.
inline std::unique_ptr<net> make_resnet8(backend& b, std::int64_t n) {
  auto m = std::make_unique<net>();
  m->name = "resnet8";
  m->input = {n, 3, 32, 32};
  m->body.add(std::make_unique<conv>(b, 3, 16, 3, 1, 1, false, 21))
      .add(std::make_unique<batchnorm>(b, 16))
      .add(std::make_unique<relu>())
      .add(std::make_unique<basic_block>(b, 16, 16, 1, 100))
      .add(std::make_unique<basic_block>(b, 16, 32, 2, 200))
      .add(std::make_unique<basic_block>(b, 32, 64, 2, 300))
      .add(std::make_unique<pool>(core::pool2d_desc{core::pool_kind::avg, 8, 8, 8, 8, 0, 0}))
      .add(std::make_unique<linear>(b, 64, 10, 31));
  m->prepare(b, 41);
  return m;
}

}  // namespace cleave::bench
