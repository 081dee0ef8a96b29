// Activations kept in oneDNN's blocked layouts between ops: the same values as a backend that
// reorders every output back to row-major, with no reorder until something reads them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../support/residual_chain.h"
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

using chain = cleave::testing::residual_chain;

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
  const chain ck(kept, 1, 0.1f), cp(plain, 1, 0.1f);
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
  chain ck(kept, 1, 0.1f), cp(plain, 1, 0.1f);
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
