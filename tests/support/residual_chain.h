// A residual block's ops on 32 channels (blocked on x86 oneDNN), forward and backward, on one
// backend: conv -> batch norm -> ReLU -> (+ conv output) -> clamp -> conv, then the gradients
// back through them. The tensors are left unread, so a backend may still hold them in a layout
// of its own.
#pragma once

#include <vector>

#include "backend_harness.h"

namespace cleave::testing {

struct residual_chain {
  static constexpr std::int64_t n = 4, c = 32, h = 8;
  core::tensor x, w, w2, g, be, rm, rv, mean, invstd, y, z, a, s, r6, y2, dy2, dr6, ds, da, dz, dy, dw, dw2, dg, db;

  // Inputs drawn from seeds seed .. seed + 5; weights in [-weight_range, weight_range).
  residual_chain(core::backend& b, std::uint64_t seed, float weight_range) {
    const core::shape sx{n, c, h, h}, sw{c, c, 3, 3};
    const core::conv2d_desc d{1, 1, 1, 1, 1};
    const core::batchnorm_desc bn{1e-5f, 0.1f};
    x = make(b, sx, random_vec(sx.numel(), seed));
    w = make(b, sw, random_vec(sw.numel(), seed + 1, -weight_range, weight_range));
    w2 = make(b, sw, random_vec(sw.numel(), seed + 2, -weight_range, weight_range));
    dy2 = make(b, sx, random_vec(sx.numel(), seed + 3));
    g = make(b, {c}, random_vec(c, seed + 4, 0.5f, 1.5f));
    be = make(b, {c}, random_vec(c, seed + 5));
    rm = b.zeros({c});
    rv = make(b, {c}, std::vector<float>(c, 1.0f));
    mean = b.empty({c});
    invstd = b.empty({c});
    for (core::tensor* t : {&y, &z, &a, &s, &r6, &y2, &dr6, &ds, &da, &dz, &dy}) *t = b.empty(sx);
    dw = b.zeros(sw);
    dw2 = b.zeros(sw);
    dg = b.zeros({c});
    db = b.zeros({c});
    b.conv2d_forward(d, x, w, {}, y);
    b.batchnorm_forward_train(bn, y, g, be, z, mean, invstd, rm, rv);
    b.relu_forward(z, a);
    b.add(a, y, s);
    b.clamp_forward(s, r6, 0.0f, 6.0f);
    b.conv2d_forward(d, r6, w2, {}, y2);
    b.conv2d_backward_data(d, dy2, w2, dr6);
    b.conv2d_backward_weights(d, r6, dy2, dw2, {});
    b.clamp_backward(r6, dr6, ds, 0.0f, 6.0f);
    b.relu_backward(a, ds, da);
    b.batchnorm_backward(bn, y, da, g, mean, invstd, dz, dg, db);
    b.axpy(1.0f, ds, dz);  // the residual's gradient
    b.conv2d_backward_data(d, dz, w, dy);
    b.conv2d_backward_weights(d, x, dz, dw, {});
  }
  std::vector<core::tensor> outputs() const {
    return {y, z, a, s, r6, y2, dr6, ds, da, dz, dy, dw, dw2, dg, db, rm, rv};
  }
};

}  // namespace cleave::testing
