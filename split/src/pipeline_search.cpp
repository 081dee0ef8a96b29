// The planner's search over cuts at one micro-batch count M. T = max(P, busy bounds) with
// P = sum_i s_i + (M - 1) * max_i s_i + L (splitter.h) is no longer a sum along the chain, so the
// cuts are enumerated depth first in lexicographic order (cut 0, then cut 1, ...) and pruned by
// lower bounds of T: of P, and of the busy bounds of the nodes (and on the U the links) that the
// cuts placed so far determine at least:
//   - a prefix is dropped when a bound of every route extending it reaches the best T found so
//     far (a later route of equal T would lose the tie anyway) or exceeds the caller's bound;
//   - since segment k only grows with its end c, a bound that takes it at its value at c and the
//     rest at its least over cuts >= c ends the loop over c at once;
//   - the routes under the first cut of least bound are searched first, and the T found there
//     bounds the ordered search (strictly, so that it still finds the first route of least T).
// Bounds of a suffix starting with segment k at cut c, relaxing memory (hop_k: up + down, its
// longer direction in the max; the segments' longer pass likewise):
//   low_sum[k][c] = min over e >= c of hop_k(e) + low_sum[k+1][e],  low_sum[last][c] = last(c)
//   low_max[k][c] = min over e >= c of max(hop_k(e), low_max[k+1][e])
// (segment k taken as free; on the U-shaped path through an edge, four cuts deep, segment k
// [c, e) is counted too at O(n^2) per k), each raised to the work left whichever way the cuts
// fall (work_bounds). A prefix's bound is its stages followed by s_k, hop_k and low_sum[k+1]
// added in the oracle's order, plus (M - 1) * max(its stages, low_max[k+1]), plus L. Every term
// is below the true one and the operations are monotone, so the bound holds in floating point
// too (splitter.cpp); the work bound, summed in another order, keeps a margin for that. A
// complete route whose P beats the best is priced whole (time_of, as the oracle does).
#include <algorithm>

#include "planner_tables.h"

namespace cleave::split::detail {

namespace {

class searcher {
 public:
  searcher(const pipeline_tables& t, double bound) : t_(t), bound_(bound), k_last_(t.n_segments - 1) {
    const auto w = static_cast<std::size_t>(t.n + 1);
    tail_mem_.resize(w);
    for (int c = 0; c <= t.n; ++c) tail_mem_[static_cast<std::size_t>(c)] = (*t.mem)(c, t.n);
    low_sum_[static_cast<std::size_t>(k_last_)] = t.last;
    low_max_[static_cast<std::size_t>(k_last_)] = t.last;
    for (int k = k_last_ - 1; k >= 0; --k) {
      running_bounds(k);
      if (k == 0) break;
      if (t.n_segments == 5) {
        segment_bounds(k);
      } else {
        low_sum_[static_cast<std::size_t>(k)] = tail_sum_[static_cast<std::size_t>(k)];
        low_max_[static_cast<std::size_t>(k)] = tail_max_[static_cast<std::size_t>(k)];
      }
      work_bounds(k);
    }
    const auto& h = t.hop[static_cast<std::size_t>(k_last_ - 1)];
    const auto& ht = t.hop_top[static_cast<std::size_t>(k_last_ - 1)];
    for (std::size_t c = 0; c < w; ++c) {
      q_.push_back(h[c] + t.last[c]);
      mq_.push_back(std::max(ht[c], t.last[c]));
    }
  }

  pipeline_best run() {
    if (k_last_ == 1) {
      leaf(0, 0, 0.0, 0.0);
      return best_;
    }
    // First the routes under the first cut of least bound: a good route found early bounds the
    // ordered search (strictly, so that a smaller route of equal T still wins there).
    if (const int guess = first_guess(); guess >= 0) {
      level(0, 0, 0, 0.0, 0.0, guess);
      bound_ = std::min(bound_, best_.seconds);
      best_ = pipeline_best{};
    }
    level(0, 0, 0, 0.0, 0.0);
    return best_;
  }

 private:
  // tail_sum[k][c] = min over e >= c of hop_k(e) + low_sum[k+1][e], tail_max[k] likewise.
  void running_bounds(int k) {
    const auto w = static_cast<std::size_t>(t_.n + 1);
    const auto& ns = low_sum_[static_cast<std::size_t>(k + 1)];
    const auto& nm = low_max_[static_cast<std::size_t>(k + 1)];
    const auto& h = t_.hop[static_cast<std::size_t>(k)];
    const auto& ht = t_.hop_top[static_cast<std::size_t>(k)];
    auto& ts = tail_sum_[static_cast<std::size_t>(k)];
    auto& tm = tail_max_[static_cast<std::size_t>(k)];
    ts.assign(w, unlimited);
    tm.assign(w, unlimited);
    double rs = unlimited, rm = unlimited;
    for (int c = t_.max_cut(); c >= 0; --c) {
      const auto i = static_cast<std::size_t>(c);
      rs = std::min(rs, h[i] + ns[i]);
      rm = std::min(rm, std::max(ht[i], nm[i]));
      ts[i] = rs;
      tm[i] = rm;
    }
  }

  // low_sum[k] with segment k [c, e) counted too: O(n^2), worth it where four cuts are enumerated.
  void segment_bounds(int k) {
    const auto w = static_cast<std::size_t>(t_.n + 1);
    const auto& ns = low_sum_[static_cast<std::size_t>(k + 1)];
    const auto& nm = low_max_[static_cast<std::size_t>(k + 1)];
    const auto& h = t_.hop[static_cast<std::size_t>(k)];
    const auto& ht = t_.hop_top[static_cast<std::size_t>(k)];
    auto& ls = low_sum_[static_cast<std::size_t>(k)];
    auto& lm = low_max_[static_cast<std::size_t>(k)];
    ls.assign(w, unlimited);
    lm.assign(w, unlimited);
    for (int c = 0; c <= t_.max_cut(); ++c) {
      double rs = unlimited, rm = unlimited;
      for (int e = c; e <= t_.max_cut(); ++e) {
        const auto i = static_cast<std::size_t>(e);
        rs = std::min(rs, t_.segment(k, c, e) + (h[i] + ns[i]));
        rm = std::min(rm, std::max({t_.segment_top(k, c, e), ht[i], nm[i]}));
      }
      ls[static_cast<std::size_t>(c)] = rs;
      lm[static_cast<std::size_t>(c)] = rm;
    }
  }

  // The work left from segment k at cut c, whichever way the cuts fall: every block [c, n) on the
  // fastest node of segments k.., every hop k.. at its cheapest cut >= c; and the longest stage at
  // least that work shared evenly by the stages of segments k.. (two passes each, the last one
  // stage), or the backward passes' (the forwards') work shared by the backward stages and the
  // last segment. These sums are added in another order than the oracle's, so they are lowered by
  // a relative margin far above the rounding of either (a few ulps per block).
  void work_bounds(int k) {
    constexpr double margin = 1.0 - 1e-9;
    const int cm = t_.max_cut(), last = t_.n_segments - 1;
    least_.assign(static_cast<std::size_t>(t_.n), unlimited);
    least_fwd_.assign(least_.size(), unlimited);
    least_bwd_.assign(least_.size(), unlimited);
    for (int j = k; j <= last; ++j) {
      const auto u = static_cast<std::size_t>(j);
      const auto& b = t_.block[u];
      const auto& f = j < last ? t_.block_fwd[u] : b;
      const auto& g = j < last ? t_.block_bwd[u] : b;
      for (std::size_t i = 0; i < b.size(); ++i) {
        least_[i] = std::min(least_[i], b[i]);
        least_fwd_[i] = std::min(least_fwd_[i], f[i]);
        least_bwd_[i] = std::min(least_bwd_[i], g[i]);
      }
    }
    auto& ls = low_sum_[static_cast<std::size_t>(k)];
    auto& lm = low_max_[static_cast<std::size_t>(k)];
    std::array<double, 4> hop_floor;
    hop_floor.fill(unlimited);
    const double n_stages = static_cast<double>(2 * (last - k) + 1), n_one_way = static_cast<double>(last - k + 1);
    double work = 0, work_fwd = 0, work_bwd = 0;
    for (int c = t_.n; c >= 0; --c) {
      if (c < t_.n) {
        const auto i = static_cast<std::size_t>(c);
        work += least_[i], work_fwd += least_fwd_[i], work_bwd += least_bwd_[i];
      }
      if (c > cm) continue;
      double hops = 0;
      for (int j = k; j < last; ++j) {
        auto& f = hop_floor[static_cast<std::size_t>(j)];
        f = std::min(f, t_.hop[static_cast<std::size_t>(j)][static_cast<std::size_t>(c)]);
        hops += f;
      }
      const double sum = (work + hops) * margin;
      const double top = std::max(work / n_stages, std::max(work_fwd, work_bwd) / n_one_way) * margin;
      const auto i = static_cast<std::size_t>(c);
      if (sum > 1e-290) ls[i] = std::max(ls[i], sum);
      if (top > 1e-290) lm[i] = std::max(lm[i], top);
    }
  }

  // Whether a bound of a route (or of every route with a later cut) rules it out.
  bool beaten(double low) const { return low >= best_.seconds || low > bound_; }

  // A bound of T from bounds of P's sum and longest stage, and of a busy bound.
  double low(double sum, double top, double busy) const {
    return std::max(pipeline_seconds(sum, top, t_.m) + t_.latency, busy);
  }
  // The busy bound of segment k's node (time_of's node_bounds, with the same operations on the same
  // terms), its own time counting segment k = s only (in U-shape the mirrored segment is not placed
  // yet), from the prefix below it; 0 where k's node has none of its own. It grows with s. Off the
  // U these are all of time_of's busy bounds: a route's T is max(P, its nodes' bounds), bit for bit.
  double node_floor(int k, double s) const {
    if (t_.u_shape ? k > k_last_ / 2 : k >= k_last_) return 0.0;
    const auto i = static_cast<std::size_t>(k);
    return (below_[i] + below_rtt_[i]) + static_cast<double>(t_.m) * s;
  }
  // The prefix below segment k + 1 once segment k (s) and hop k (h, at cut c) are placed.
  void place(int k, double s, double h, std::size_t c) {
    const auto i = static_cast<std::size_t>(k);
    below_[i + 1] = (below_[i] + s) + h;
    below_rtt_[i + 1] = below_rtt_[i] + t_.rtt[i];
    if (!t_.u_shape) return;
    hop_up_[i] = direction_seconds((*t_.up_total[i])[c], t_.m);
    hop_down_[i] = direction_seconds((*t_.down_total[i])[c], t_.m);
  }
  // On the U, the busy bounds of the link directions hop k (at cut c) rides (time_of's link_bound,
  // counting none of the stages before or after): M times its longer direction, and once its
  // mirror (the hop on the same link) is placed, M times each direction's two stages.
  double link_floor(int k, std::size_t c) const {
    if (!t_.u_shape) return 0.0;  // every link direction serves one stage
    const double m = static_cast<double>(t_.m);
    const auto i = static_cast<std::size_t>(k), j = static_cast<std::size_t>(k_last_ - 1 - k);
    if (j > i) return m * t_.hop_top[i][c];
    const double up = direction_seconds((*t_.up_total[i])[c], t_.m);
    const double down = direction_seconds((*t_.down_total[i])[c], t_.m);
    return std::max(m * (hop_up_[j] + down), m * (up + hop_down_[j]));
  }

  // The prefix's stages pre_[0 .. np) added to `rest` in the oracle's order.
  double fold(int np, double rest) const {
    for (int j = np - 1; j >= 0; --j) rest = pre_[static_cast<std::size_t>(j)] + rest;
    return rest;
  }

  // The first cut of least bound within memory; -1 if none.
  int first_guess() const {
    const double* mem = t_.mem->row(0);
    const auto& ls = low_sum_[1];
    const auto& lm = low_max_[1];
    int guess = -1;
    double least = unlimited;
    for (int c = t_.min_first; c <= t_.max_first(); ++c) {
      const auto i = static_cast<std::size_t>(c);
      if (mem[i] > t_.cap[0]) break;
      const double s = t_.first[i], h = t_.hop[0][i];
      const double floor = std::max(node_floor(0, s), link_floor(0, i));
      const double bound = low(s + (h + ls[i]), std::max({t_.first_top[i], t_.hop_top[0][i], lm[i]}), floor);
      if (bound < least) least = bound, guess = c;
    }
    return guess;
  }

  // Cut k (segment k = [b, c)) for k below the last cut; np stages fixed so far, the longest of
  // them pmax, busy a bound of the busy bounds of the nodes below. only >= 0: that cut only.
  void level(int k, int b, int np, double pmax, double busy, int only = -1) {
    const int node = t_.node_of_segment[static_cast<std::size_t>(k)];
    const double used = used_[static_cast<std::size_t>(node)], cap = t_.cap[static_cast<std::size_t>(node)];
    const double* mem = t_.mem->row(b);
    const auto& ls = low_sum_[static_cast<std::size_t>(k + 1)];
    const auto& lm = low_max_[static_cast<std::size_t>(k + 1)];
    const auto& hop = t_.hop[static_cast<std::size_t>(k)];
    const auto& hop_top = t_.hop_top[static_cast<std::size_t>(k)];
    const auto& ts = tail_sum_[static_cast<std::size_t>(k)];
    const auto& tm = tail_max_[static_cast<std::size_t>(k)];
    for (int c = std::max(b, k == 0 ? t_.min_first : 1); c <= t_.max_at(k); ++c) {
      const auto i = static_cast<std::size_t>(c);
      if (used + mem[i] > cap) break;  // grows with c
      if (only >= 0 && c != only) {
        if (c > only) break;
        continue;
      }
      const double s = t_.segment(k, b, c), st = t_.segment_top(k, b, c), h = hop[i], ht = hop_top[i];
      const double floor = std::max(busy, node_floor(k, s));
      // Segment k only grows with c: past this bound no later c can win either.
      if (beaten(low(fold(np, s + ts[i]), std::max({pmax, st, tm[i]}), floor))) break;
      const double links = std::max(floor, link_floor(k, i));  // not monotone in c: the cut's size
      if (beaten(low(fold(np, s + (h + ls[i])), std::max({pmax, st, ht, lm[i]}), links))) continue;
      pre_[static_cast<std::size_t>(np)] = s;
      pre_[static_cast<std::size_t>(np + 1)] = h;
      used_[static_cast<std::size_t>(node)] = used + mem[i];
      cuts_[static_cast<std::size_t>(k)] = c;
      place(k, s, h, i);
      if (k + 1 == k_last_ - 1)
        leaf(c, np + 2, std::max({pmax, st, ht}), links);
      else
        level(k + 1, c, np + 2, std::max({pmax, st, ht}), links);
      used_[static_cast<std::size_t>(node)] = used;
    }
  }

  // The last cut c (segment k_last_ - 1 = [b, c), the last segment [c, n)): every route complete.
  // Its P and the busy bounds of its nodes (computed as time_of computes them) bound its T, and
  // are T off the U; on the U a route whose bound beats the best is priced whole.
  void leaf(int b, int np, double pmax, double busy) {
    const int k = k_last_ - 1;
    const int node = t_.node_of_segment[static_cast<std::size_t>(k)];
    const int top = t_.node_of_segment[static_cast<std::size_t>(k_last_)];
    const double used = used_[static_cast<std::size_t>(node)], cap = t_.cap[static_cast<std::size_t>(node)];
    const double used_top = used_[static_cast<std::size_t>(top)], cap_top = t_.cap[static_cast<std::size_t>(top)];
    const double* mem = t_.mem->row(b);
    const auto& ts = tail_sum_[static_cast<std::size_t>(k)];
    const auto& tm = tail_max_[static_cast<std::size_t>(k)];
    const double m = static_cast<double>(t_.m);
    int c = std::max(b, k == 0 ? t_.min_first : 1);
    while (c <= t_.max_at(k) && used_top + tail_mem_[static_cast<std::size_t>(c)] > cap_top) ++c;  // shrinks with c
    for (; c <= t_.max_at(k); ++c) {
      const auto i = static_cast<std::size_t>(c);
      if (used + mem[i] > cap) break;
      const double s = t_.segment(k, b, c), st = t_.segment_top(k, b, c);
      // The nodes' bounds that grow with c, then the device's on the U (its top shrinks).
      double rising = std::max(busy, node_floor(k, s)), floor = rising;
      if (t_.u_shape) {
        if (k_last_ == 4) rising = std::max(rising, (below_[1] + below_rtt_[1]) + m * (pre_[2] + s));  // the edge
        floor = std::max({rising, (0.0 + 0.0) + m * (pre_[0] + t_.last[i]), link_floor(k, i)});
      }
      const double p = low(fold(np, s + q_[i]), std::max(pmax, std::max(st, mq_[i])), floor);
      double total = p;
      if (p < best_.seconds && t_.u_shape) {  // the links' busy bounds
        cuts_[static_cast<std::size_t>(k)] = c;
        total = t_.seconds(cuts_.data());
      }
      if (total < best_.seconds) {
        best_.seconds = total;
        cuts_[static_cast<std::size_t>(k)] = c;
        best_.cuts.assign(cuts_.begin(), cuts_.begin() + k_last_);
      } else if (beaten(low(fold(np, s + ts[i]), std::max({pmax, st, tm[i]}), rising))) {
        break;  // segment k only grows with c
      }
    }
  }

  const pipeline_tables& t_;
  double bound_;
  const int k_last_;
  std::vector<double> tail_mem_, q_, mq_, least_, least_fwd_, least_bwd_;
  std::array<std::vector<double>, 5> low_sum_, low_max_, tail_sum_, tail_max_;
  std::array<double, 8> pre_{};
  std::array<double, 5> below_{}, below_rtt_{};  // [k]: the stages and round trips below segment k
  std::array<double, 4> hop_up_{}, hop_down_{};  // [k]: hop k's directions as placed
  std::array<double, 3> used_{};
  std::array<int, 4> cuts_{};
  pipeline_best best_;
};

}  // namespace

pipeline_best search_pipeline(const pipeline_tables& t, double bound) {
  return searcher(t, bound).run();
}

route_terms pipeline_tables::terms(const int* cuts) const {
  route_terms r;
  r.m = m;
  r.u_shape = u_shape;
  if (!u_shape && cuts[0] == n) {  // device-only: segment 0 alone, with the loss
    r.n_segments = 1;
    r.seg[0] = first[static_cast<std::size_t>(n)];
    return r;
  }
  r.n_segments = n_segments;
  for (int k = 0; k < n_segments; ++k) {
    const auto i = static_cast<std::size_t>(k);
    const int b = k == 0 ? 0 : cuts[k - 1];
    const int e = k + 1 == n_segments ? n : cuts[k];
    r.seg[i] = segment(k, b, e);
    if (k + 1 == n_segments) break;
    const auto c = static_cast<std::size_t>(e);
    r.fwd[i] = segment_stage((k == 0 ? (*first_fwd)[c] : passes[i]->fwd(b, e)) * share[i], m);
    r.bwd[i] = segment_stage((k == 0 ? (*first_bwd)[c] : passes[i]->bwd(b, e)) * share[i], m);
    r.up[i] = direction_seconds((*up_total[i])[c], m);
    r.down[i] = direction_seconds((*down_total[i])[c], m);
    r.rtt[i] = rtt[i];
  }
  return r;
}

double pipeline_seconds_of(const pipeline_tables& t, const std::vector<int>& cuts) {
  return t.seconds(cuts.data());
}

}  // namespace cleave::split::detail
