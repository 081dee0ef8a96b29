// Cuts used when none are configured: each boundary at the smallest activation within its
// share of the chain (small activations are cheap to send), the U-shape top on the device.
#pragma once

#include <vector>

#include "cleave/core/model.h"

namespace cleave::server {

inline int smallest_output_cut(const core::model_spec& m, int lo, int hi) {
  int best = lo;
  for (int k = lo; k <= hi; ++k)
    if (m.blocks[static_cast<std::size_t>(k - 1)].out.numel() <
        m.blocks[static_cast<std::size_t>(best - 1)].out.numel())
      best = k;
  return best;
}

inline std::vector<int> default_cuts(const core::model_spec& m, bool u_shape, bool with_edge) {
  const int n = m.n_blocks();
  const int top = u_shape ? n - 1 : n;  // blocks below the device's top
  std::vector<int> cuts;
  if (with_edge) {
    const int c1 = smallest_output_cut(m, 1, std::max(1, top / 3));
    const int c2 = smallest_output_cut(m, std::min(top, c1 + 1), std::max(c1 + 1, std::min(top, 2 * top / 3)));
    cuts = {c1, std::min(c2, top)};
  } else {
    cuts = {smallest_output_cut(m, 1, std::max(1, top / 2))};
  }
  if (u_shape) {
    cuts.push_back(top);
    if (with_edge) cuts.push_back(top);
  }
  return cuts;
}

}  // namespace cleave::server
