// The exhaustive search that checks the planner (planner.cpp): every route, micro-batch count and
// codec of every hop of every device, priced with the oracle's stage functions (cost_terms.h) and
// the first cheapest kept, in the tie-break order of splitter.h.
#include <optional>

#include "cleave/core/error.h"
#include "cost_terms.h"

namespace cleave::split {

using namespace detail;

namespace {

struct candidate {
  route r;
  route_choice c;
  double seconds = unlimited;
};

// Every choice for route r (already within memory), in tie-break order: M ascending, then the
// codecs (hop 0 up, hop 0 down, hop 1 up, ...) lexicographically by their index in `codecs`.
void each_choice(const split_problem& p, int d, const route& r, const std::vector<codec_option>& codecs,
                 candidate& best) {
  const std::size_t n_hops = r.path.size() - 1, nc = codecs.size();
  std::vector<double> seg(r.path.size()), fwd(r.path.size()), bwd(r.path.size()), dir(n_hops * nc);
  for (int k = 0; k < r.n_segments(); ++k) {
    const auto i = static_cast<std::size_t>(k);
    const core::tier t = r.path[i];
    const node_costs& node = node_of(p, d, t);
    double sum = 0, f = 0, b = 0;
    for (int j = r.begin(k); j < r.end(k); ++j) {
      const auto u = static_cast<std::size_t>(j);
      sum += node.block_seconds[u];
      f += forward_of(node, u);
      b += backward_of(node, u);
    }
    const double share = share_of(p, d, t);
    seg[i] = sum * share, fwd[i] = f * share, bwd[i] = b * share;
  }
  route_terms terms;
  terms.n_segments = r.device_only() ? 1 : r.n_segments();  // no hop: the loss on the device
  terms.u_shape = r.u_shape();
  std::vector<std::size_t> slot(2 * n_hops);
  for (const int m : micro_options(p)) {
    terms.m = m;
    for (std::size_t k = 0; k < r.path.size(); ++k) {
      terms.seg[k] = segment_stage(seg[k], m);
      if (k < n_hops) terms.fwd[k] = segment_stage(fwd[k], m), terms.bwd[k] = segment_stage(bwd[k], m);
    }
    for (std::size_t k = 0; k < n_hops; ++k) {
      const int cut = r.end(static_cast<int>(k));
      const auto& link = link_between(p, d, r.path[k], r.path[k + 1]);
      terms.rtt[k] = link.rtt_seconds;
      for (std::size_t i = 0; i < nc; ++i) dir[k * nc + i] = direction_seconds(p, link, codecs[i], cut, m);
    }
    std::fill(slot.begin(), slot.end(), 0);
    for (;;) {
      bool ok = true;
      for (std::size_t k = 0; k < n_hops && ok; ++k) ok = core::codec_for_activations(codecs[slot[2 * k]].id);
      if (ok) {
        for (std::size_t k = 0; k < n_hops; ++k)
          terms.up[k] = dir[k * nc + slot[2 * k]], terms.down[k] = dir[k * nc + slot[2 * k + 1]];
        const double t = time_of(terms).seconds;
        if (t < best.seconds) {
          best.r = r;
          best.seconds = t;
          best.c.n_micro_batches = m;
          best.c.hops.resize(n_hops);
          for (std::size_t k = 0; k < n_hops; ++k)
            best.c.hops[k] = {codecs[slot[2 * k]].id, codecs[slot[2 * k + 1]].id};
        }
      }
      std::size_t j = slot.size();  // odometer, the last slot fastest
      while (j > 0 && slot[j - 1] + 1 == nc) slot[--j] = 0;
      if (j == 0) break;
      ++slot[j - 1];
    }
  }
}

}  // namespace

split_plan plan_exhaustive(const split_problem& p) {
  validate(p);
  const auto codecs = codec_options(p);
  split_plan out;
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const int di = static_cast<int>(d);
    route r{path_of(p, di), {}, p.n_blocks};
    candidate best;
    bool found = false;
    std::vector<int> cuts;
    each_cuts(p.n_blocks, p.u_shape, r.path.size() - 1, cuts, [&](const std::vector<int>& c) {
      r.cuts = c;
      if (!fits_memory(p, di, r, nullptr)) return;
      found = true;
      each_choice(p, di, r, codecs, best);
    });
    if (!found) throw_infeasible(p, di);
    CLEAVE_ASSERT(evaluate_checked(p, di, best.r, best.c).seconds == best.seconds,
                  "exhaustive search and oracle disagree");
    out.routes.push_back(best.r);
    out.choices.push_back(best.c);
  }
  out.cost = assemble(p, out.routes, out.choices);
  return out;
}

}  // namespace cleave::split
