// Activations kept in oneDNN's blocked layouts between ops: the same values as a backend that
// reorders every output back to row-major, with no reorder until something reads them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../support/backend_harness.h"
#include "onednn_backend.h"
#include "test_util.h"

using cleave::core::shape;
using cleave::core::tensor;
using namespace cleave::test;
namespace core = cleave::core;
using cleave::backend::detail::onednn_options;
using cleave::testing::make;
using cleave::testing::read;

namespace {

// A residual block's ops on 32 channels (blocked on x86), forward and backward; returns the
// tensors, unread.
struct chain {
  static constexpr std::int64_t n = 4, c = 32, h = 8;
  tensor x, w, w2, g, be, rm, rv, mean, invstd, y, z, a, s, r6, y2, dy2, dr6, ds, da, dz, dy, dw, dw2, dg, db;

  explicit chain(core::backend& b) {
    const shape sx{n, c, h, h}, sw{c, c, 3, 3};
    const core::conv2d_desc d{1, 1, 1, 1, 1};
    const core::batchnorm_desc bn{1e-5f, 0.1f};
    x = make(b, sx, cleave::testing::random_vec(sx.numel(), 1));
    w = make(b, sw, cleave::testing::random_vec(sw.numel(), 2, -0.1f, 0.1f));
    w2 = make(b, sw, cleave::testing::random_vec(sw.numel(), 3, -0.1f, 0.1f));
    g = make(b, {c}, cleave::testing::random_vec(c, 4, 0.5f, 1.5f));
    be = make(b, {c}, cleave::testing::random_vec(c, 5));
    rm = b.zeros({c});
    rv = make(b, {c}, std::vector<float>(c, 1.0f));
    mean = b.empty({c});
    invstd = b.empty({c});
    for (tensor* t : {&y, &z, &a, &s, &r6, &y2, &dr6, &ds, &da, &dz, &dy}) *t = b.empty(sx);
    b.conv2d_forward(d, x, w, {}, y);
    b.batchnorm_forward_train(bn, y, g, be, z, mean, invstd, rm, rv);
    b.relu_forward(z, a);
    b.add(a, y, s);
    b.clamp_forward(s, r6, 0.0f, 6.0f);
    b.conv2d_forward(d, r6, w2, {}, y2);
    dy2 = make(b, sx, cleave::testing::random_vec(sx.numel(), 6));
    dw = b.zeros(sw);
    dw2 = b.zeros(sw);
    dg = b.zeros({c});
    db = b.zeros({c});
    b.conv2d_backward_data(d, dy2, w2, dr6);
    b.conv2d_backward_weights(d, r6, dy2, dw2, {});
    b.clamp_backward(r6, dr6, ds, 0.0f, 6.0f);
    b.relu_backward(a, ds, da);
    b.batchnorm_backward(bn, y, da, g, mean, invstd, dz, dg, db);
    b.axpy(1.0f, ds, dz);
    b.conv2d_backward_data(d, dz, w, dy);
    b.conv2d_backward_weights(d, x, dz, dw, {});
  }
  std::vector<tensor> outputs() const { return {y, z, a, s, r6, y2, dr6, ds, da, dz, dy, dw, dw2, dg, db, rm, rv}; }
};

// max |a - b| / (1 + max |b|)
double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, mag = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(b[i])));
  }
  return worst / (1.0 + mag);
}

bool blocked_cpu() {
#if defined(__x86_64__)
  return true;  // oneDNN's direct and Winograd kernels block channels in 16s (AVX-512) or 8s (AVX2)
#else
  return false;
#endif
}

}  // namespace

TEST_CASE("a residual block's activations stay blocked between ops and equal the row-major run") {
  onednn_options row_major_opt;
  row_major_opt.keep_layouts = false;
  onednn_backend kept, plain(row_major_opt);
  const chain ck(kept), cp(plain);
  // Forward and backward ran without one reorder back to row-major.
  CHECK(kept.n_layout_reorders() == 0);
  CHECK(plain.n_layout_reorders() == 0);
  const auto ok = ck.outputs(), op = cp.outputs();
  for (std::size_t i = 0; i < ok.size(); ++i) {
    CAPTURE(i);
    // Batch norm sums in another order on blocked images: rounding only.
    CHECK(rel(read(kept, ok[i]), read(plain, op[i])) < 1e-5);
  }
  // Reading a kept tensor reorders it (into the reader's memory) and leaves it kept.
  if (blocked_cpu()) {
    const auto before = kept.n_layout_reorders();
    read(kept, ck.y2);
    read(kept, ck.y2);
    CHECK(kept.n_layout_reorders() == before + 2);
  }
}

TEST_CASE("views, partial writes, host readers and row-major ops see a kept tensor's values") {
  onednn_options row_major_opt;
  row_major_opt.keep_layouts = false;
  onednn_backend kept, plain(row_major_opt);
  chain ck(kept), cp(plain);
  const std::int64_t n = chain::n, c = chain::c, h = chain::h;
  for (auto* bp : {static_cast<onednn_backend*>(&kept), &plain}) {
    auto& b = *bp;
    auto& ch = bp == &kept ? ck : cp;
    // One image overwritten through a batch slice, one filled; the other images keep theirs.
    const tensor part = make(b, {1, c, h, h}, cleave::testing::random_vec(c * h * h, 7));
    b.copy(part, ch.y2.slice_batch(1, 1));
    b.fill(ch.z.slice_batch(3, 1), 0.5f);
    // Uploaded over a kept tensor: the new values, row-major.
    b.upload(ch.a, cleave::testing::random_vec(n * c * h * h, 8).data());
    // Codec (host) readers and a dense layer over a flattened view.
    tensor amax = b.empty({c}), logits = b.empty({n, 10});
    b.channel_absmax(ch.s, amax);
    b.linear_forward(ch.r6.reshaped({n, c * h * h}),
                     make(b, {10, c * h * h}, cleave::testing::random_vec(10 * c * h * h, 9)), {}, logits);
    ch.dw = amax;
    ch.dw2 = logits;
  }
  for (auto pair : {std::pair{ck.y2, cp.y2}, {ck.z, cp.z}, {ck.a, cp.a}, {ck.dw, cp.dw}, {ck.dw2, cp.dw2}})
    CHECK(rel(read(kept, pair.first), read(plain, pair.second)) < 1e-5);
  // The slices themselves read back equal.
  CHECK(rel(read(kept, ck.y2.slice_batch(0, 2)), read(plain, cp.y2.slice_batch(0, 2))) < 1e-5);
  CHECK(rel(read(kept, ck.dz.slice_batch(2, 2)), read(plain, cp.dz.slice_batch(2, 2))) < 1e-5);
}
