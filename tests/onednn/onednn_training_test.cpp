// End to end: LeNet-5 training steps (every op of a CNN step, SGD with momentum) give the same
// losses and weights on onednn as on the reference backend.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "test_util.h"

using cleave::core::shape;
using cleave::core::tensor;
using namespace cleave::test;
namespace core = cleave::core;

namespace {

// LeNet-5 on one backend: conv 6@5x5 pad 2, ReLU, maxpool 2, conv 16@5x5, ReLU, maxpool 2,
// fc 120, ReLU, fc 84, ReLU, fc 10, softmax cross-entropy.
struct lenet {
  static constexpr std::int64_t n = 16;
  core::backend& b;
  std::vector<tensor> params, grads, moms;  // w1 b1 w2 b2 w3 b3 w4 b4 w5 b5

  lenet(core::backend& be, std::uint64_t seed) : b(be) {
    const shape shapes[] = {{6, 1, 5, 5}, {6}, {16, 6, 5, 5}, {16}, {120, 400}, {120}, {84, 120}, {84}, {10, 84}, {10}};
    core::rng g(seed);
    for (const auto& s : shapes) {
      std::vector<float> v(static_cast<std::size_t>(s.numel()));
      const float scale = s.rank() == 1 ? 0.1f : 1.0f / std::sqrt(static_cast<float>(s.numel_from(1)));
      for (auto& e : v) e = g.uniform(-scale, scale);
      params.push_back(b.empty(s));
      b.upload(params.back(), v.data());
      grads.push_back(b.zeros(s));
      moms.push_back(b.zeros(s));
    }
  }

  float step(const tensor& x, const tensor& labels) {
    const core::conv2d_desc c1{1, 1, 2, 2}, c2{1, 1, 0, 0};
    const core::pool2d_desc pool{core::pool_kind::max, 2, 2, 2, 2, 0, 0};
    auto a1 = b.empty({n, 6, 28, 28}), p1 = b.empty({n, 6, 14, 14});
    auto a2 = b.empty({n, 16, 10, 10}), p2 = b.empty({n, 16, 5, 5});
    auto a3 = b.empty({n, 120}), a4 = b.empty({n, 84}), logits = b.empty({n, 10});
    auto probs = b.empty({n, 10}), loss = b.empty({1});
    tensor ws1, ws2;
    b.conv2d_forward(c1, x, params[0], params[1], a1);
    b.relu_forward(a1, a1);
    b.pool2d_forward(pool, a1, p1, &ws1);
    b.conv2d_forward(c2, p1, params[2], params[3], a2);
    b.relu_forward(a2, a2);
    b.pool2d_forward(pool, a2, p2, &ws2);
    const auto flat = p2.reshaped({n, 400});
    b.linear_forward(flat, params[4], params[5], a3);
    b.relu_forward(a3, a3);
    b.linear_forward(a3, params[6], params[7], a4);
    b.relu_forward(a4, a4);
    b.linear_forward(a4, params[8], params[9], logits);
    b.softmax_xent_forward(logits, labels, probs, loss);

    for (auto& gr : grads) b.fill(gr, 0.0f);
    auto dlogits = b.empty({n, 10}), d4 = b.empty({n, 84}), d3 = b.empty({n, 120});
    auto dflat = b.empty({n, 400}), d2 = b.empty({n, 16, 10, 10}), dp1 = b.empty({n, 6, 14, 14});
    auto d1 = b.empty({n, 6, 28, 28});
    b.softmax_xent_backward(probs, labels, dlogits, 1.0f);
    b.linear_backward_weights(a4, dlogits, grads[8], grads[9]);
    b.linear_backward_data(dlogits, params[8], d4);
    b.relu_backward(a4, d4, d4);
    b.linear_backward_weights(a3, d4, grads[6], grads[7]);
    b.linear_backward_data(d4, params[6], d3);
    b.relu_backward(a3, d3, d3);
    b.linear_backward_weights(flat, d3, grads[4], grads[5]);
    b.linear_backward_data(d3, params[4], dflat);
    b.pool2d_backward(pool, a2, dflat.reshaped({n, 16, 5, 5}), ws2, d2);
    b.relu_backward(a2, d2, d2);
    b.conv2d_backward_weights(c2, p1, d2, grads[2], grads[3]);
    b.conv2d_backward_data(c2, d2, params[2], dp1);
    b.pool2d_backward(pool, a1, dp1, ws1, d1);
    b.relu_backward(a1, d1, d1);
    b.conv2d_backward_weights(c1, x, d1, grads[0], grads[1]);

    const core::sgd_desc sgd{0.05f, 0.9f, 1e-4f, false};
    for (std::size_t i = 0; i < params.size(); ++i) b.sgd_update(sgd, params[i], grads[i], moms[i]);
    float l = 0.0f;
    b.download(loss, &l);
    return l;
  }
};

}  // namespace

TEST_CASE("LeNet-5 training steps on onednn follow the reference backend") {
  backends b;
  core::rng g(12);
  const std::int64_t n = lenet::n;
  lenet ref(b.ref, 99), dnn(b.dnn, 99);
  std::vector<float> labels_host(n);
  for (int step = 0; step < 5; ++step) {
    auto x = b.random({n, 1, 28, 28}, g, 0.0f, 1.0f);
    std::vector<std::int32_t> lab(static_cast<std::size_t>(n));
    for (auto& l : lab) l = static_cast<std::int32_t>(g.below(10));
    auto lr = b.ref.empty({n}, core::dtype::i32), ld = b.dnn.empty({n}, core::dtype::i32);
    b.ref.upload(lr, lab.data());
    b.dnn.upload(ld, lab.data());
    const float loss_r = ref.step(x.r, lr), loss_d = dnn.step(x.d, ld);
    INFO("step " << step);
    CHECK(std::isfinite(loss_r));
    CHECK(loss_d == doctest::Approx(loss_r).epsilon(1e-4));
  }
  for (std::size_t i = 0; i < ref.params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(rel_error(b, twin{ref.params[i], dnn.params[i]}) < 1e-4);
  }
}
