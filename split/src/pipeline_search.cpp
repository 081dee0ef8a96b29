// The planner's search over cuts at one micro-batch count M. With T = sum_i s_i + (M - 1) *
// max_i s_i the cost is no longer a sum along the chain, so the cuts are enumerated depth first
// in lexicographic order (cut 0, then cut 1, ...) and pruned by lower bounds:
//   - a prefix is dropped when a bound of every route extending it reaches the best T found so
//     far (a later route of equal T would lose the tie anyway) or exceeds the caller's bound;
//   - since segment k only grows with its end c, a bound that takes it at its value at c and the
//     rest at its least over cuts >= c ends the loop over c at once;
//   - the routes under the first cut of least bound are searched first, and the T found there
//     bounds the ordered search (strictly, so that it still finds the first route of least T).
// Bounds of a suffix starting with segment k at cut c, relaxing memory:
//   low_sum[k][c] = min over e >= c of hop_k(e) + low_sum[k+1][e],  low_sum[last][c] = last(c)
//   low_max[k][c] = min over e >= c of max(hop_k(e), low_max[k+1][e])
// (segment k taken as free; on the U-shaped path through an edge, four cuts deep, segment k
// [c, e) is counted too at O(n^2) per k), each raised to the work left whichever way the cuts
// fall (work_bounds). A prefix's bound is its stages followed by s_k, hop_k and low_sum[k+1]
// added in the oracle's order, plus (M - 1) * max(its stages, low_max[k+1]). Every term is below
// the true one and the operations are monotone, so the bound holds in floating point too
// (splitter.cpp); the work bound, summed in another order, keeps a margin for that.
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
    for (std::size_t c = 0; c < w; ++c) {
      q_.push_back(h[c] + t.last[c]);
      mq_.push_back(std::max(h[c], t.last[c]));
    }
  }

  pipeline_best run() {
    if (k_last_ == 1) {
      leaf(0, 0, 0.0);
      return best_;
    }
    // First the routes under the first cut of least bound: a good route found early bounds the
    // ordered search (strictly, so that a smaller route of equal T still wins there).
    if (const int guess = first_guess(); guess >= 0) {
      level(0, 0, 0, 0.0, guess);
      bound_ = std::min(bound_, best_.seconds);
      best_ = pipeline_best{};
    }
    level(0, 0, 0, 0.0);
    return best_;
  }

 private:
  // tail_sum[k][c] = min over e >= c of hop_k(e) + low_sum[k+1][e], tail_max[k] likewise.
  void running_bounds(int k) {
    const auto w = static_cast<std::size_t>(t_.n + 1);
    const auto& ns = low_sum_[static_cast<std::size_t>(k + 1)];
    const auto& nm = low_max_[static_cast<std::size_t>(k + 1)];
    const auto& h = t_.hop[static_cast<std::size_t>(k)];
    auto& ts = tail_sum_[static_cast<std::size_t>(k)];
    auto& tm = tail_max_[static_cast<std::size_t>(k)];
    ts.assign(w, unlimited);
    tm.assign(w, unlimited);
    double rs = unlimited, rm = unlimited;
    for (int c = t_.max_cut(); c >= 0; --c) {
      const auto i = static_cast<std::size_t>(c);
      rs = std::min(rs, h[i] + ns[i]);
      rm = std::min(rm, std::max(h[i], nm[i]));
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
    auto& ls = low_sum_[static_cast<std::size_t>(k)];
    auto& lm = low_max_[static_cast<std::size_t>(k)];
    ls.assign(w, unlimited);
    lm.assign(w, unlimited);
    for (int c = 0; c <= t_.max_cut(); ++c) {
      double rs = unlimited, rm = unlimited;
      for (int e = c; e <= t_.max_cut(); ++e) {
        const auto i = static_cast<std::size_t>(e);
        const double seg = t_.segment(k, c, e);
        rs = std::min(rs, seg + (h[i] + ns[i]));
        rm = std::min(rm, std::max({seg, h[i], nm[i]}));
      }
      ls[static_cast<std::size_t>(c)] = rs;
      lm[static_cast<std::size_t>(c)] = rm;
    }
  }

  // The work left from segment k at cut c, whichever way the cuts fall: every block [c, n) on the
  // fastest node of segments k.., every hop k.. at its cheapest cut >= c, and the bottleneck at
  // least that work shared evenly. These sums are added in another order than the oracle's, so
  // they are lowered by a relative margin far above the rounding of either (a few ulps per block).
  void work_bounds(int k) {
    constexpr double margin = 1.0 - 1e-9;
    const int cm = t_.max_cut();
    for (int j = k; j < t_.n_segments; ++j) {
      const auto& b = t_.block[static_cast<std::size_t>(j)];
      least_.resize(b.size(), unlimited);
      for (std::size_t i = 0; i < b.size(); ++i) least_[i] = std::min(j == k ? b[i] : least_[i], b[i]);
    }
    auto& ls = low_sum_[static_cast<std::size_t>(k)];
    auto& lm = low_max_[static_cast<std::size_t>(k)];
    std::vector<double> hop_floor(static_cast<std::size_t>(t_.n_segments), unlimited);
    double work = 0;
    for (int c = t_.n; c >= 0; --c) {
      if (c < t_.n) work += least_[static_cast<std::size_t>(c)];
      if (c > cm) continue;
      double hops = 0;
      for (int j = k; j + 1 < t_.n_segments; ++j) {
        auto& f = hop_floor[static_cast<std::size_t>(j)];
        f = std::min(f, t_.hop[static_cast<std::size_t>(j)][static_cast<std::size_t>(c)]);
        hops += f;
      }
      const double sum = (work + hops) * margin, top = work * margin / static_cast<double>(t_.n_segments - k);
      const auto i = static_cast<std::size_t>(c);
      if (sum > 1e-290) ls[i] = std::max(ls[i], sum);
      if (top > 1e-290) lm[i] = std::max(lm[i], top);
    }
  }

  // Whether a bound of a route (or of every route with a later cut) rules it out.
  bool beaten(double low) const { return low >= best_.seconds || low > bound_; }

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
    for (int c = t_.min_first; c <= t_.max_cut(); ++c) {
      const auto i = static_cast<std::size_t>(c);
      if (mem[i] > t_.cap[0]) break;
      const double s = t_.first[i], h = t_.hop[0][i];
      const double low = pipeline_seconds(s + (h + ls[i]), std::max({s, h, lm[i]}), t_.m);
      if (low < least) least = low, guess = c;
    }
    return guess;
  }

  // Cut k (segment k = [b, c)) for k below the last cut; np stages fixed so far, their max pmax.
  // only >= 0: that cut only.
  void level(int k, int b, int np, double pmax, int only = -1) {
    const int node = t_.node_of_segment[static_cast<std::size_t>(k)];
    const double used = used_[static_cast<std::size_t>(node)], cap = t_.cap[static_cast<std::size_t>(node)];
    const double* mem = t_.mem->row(b);
    const auto& ls = low_sum_[static_cast<std::size_t>(k + 1)];
    const auto& lm = low_max_[static_cast<std::size_t>(k + 1)];
    const auto& hop = t_.hop[static_cast<std::size_t>(k)];
    const auto& ts = tail_sum_[static_cast<std::size_t>(k)];
    const auto& tm = tail_max_[static_cast<std::size_t>(k)];
    for (int c = std::max(b, k == 0 ? t_.min_first : 1); c <= t_.max_cut(); ++c) {
      const auto i = static_cast<std::size_t>(c);
      if (used + mem[i] > cap) break;  // grows with c
      if (only >= 0 && c != only) {
        if (c > only) break;
        continue;
      }
      const double s = t_.segment(k, b, c), h = hop[i];
      // Segment k only grows with c: past this bound no later c can win either.
      if (beaten(pipeline_seconds(fold(np, s + ts[i]), std::max({pmax, s, tm[i]}), t_.m))) break;
      if (beaten(pipeline_seconds(fold(np, s + (h + ls[i])), std::max({pmax, s, h, lm[i]}), t_.m))) continue;
      pre_[static_cast<std::size_t>(np)] = s;
      pre_[static_cast<std::size_t>(np + 1)] = h;
      used_[static_cast<std::size_t>(node)] = used + mem[i];
      cuts_[static_cast<std::size_t>(k)] = c;
      if (k + 1 == k_last_ - 1)
        leaf(c, np + 2, std::max({pmax, s, h}));
      else
        level(k + 1, c, np + 2, std::max({pmax, s, h}));
      used_[static_cast<std::size_t>(node)] = used;
    }
  }

  // The last cut c (segment k_last_ - 1 = [b, c), the last segment [c, n)): every route complete.
  void leaf(int b, int np, double pmax) {
    const int k = k_last_ - 1;
    const int node = t_.node_of_segment[static_cast<std::size_t>(k)];
    const int top = t_.node_of_segment[static_cast<std::size_t>(k_last_)];
    const double used = used_[static_cast<std::size_t>(node)], cap = t_.cap[static_cast<std::size_t>(node)];
    const double used_top = used_[static_cast<std::size_t>(top)], cap_top = t_.cap[static_cast<std::size_t>(top)];
    const double* mem = t_.mem->row(b);
    const double* seg = k == 0 ? t_.first.data() : t_.middle[static_cast<std::size_t>(k)]->data() + b * (t_.n + 1);
    const auto& ts = tail_sum_[static_cast<std::size_t>(k)];
    const auto& tm = tail_max_[static_cast<std::size_t>(k)];
    int c = std::max(b, k == 0 ? t_.min_first : 1);
    while (c <= t_.max_cut() && used_top + tail_mem_[static_cast<std::size_t>(c)] > cap_top) ++c;  // shrinks with c
    for (; c <= t_.max_cut(); ++c) {
      const auto i = static_cast<std::size_t>(c);
      if (used + mem[i] > cap) break;
      const double s = seg[i];
      const double total = pipeline_seconds(fold(np, s + q_[i]), std::max(pmax, std::max(s, mq_[i])), t_.m);
      if (total < best_.seconds) {
        best_.seconds = total;
        cuts_[static_cast<std::size_t>(k)] = c;
        best_.cuts.assign(cuts_.begin(), cuts_.begin() + k_last_);
      } else if (beaten(pipeline_seconds(fold(np, s + ts[i]), std::max({pmax, s, tm[i]}), t_.m))) {
        break;  // segment k only grows with c
      }
    }
  }

  const pipeline_tables& t_;
  double bound_;
  const int k_last_;
  std::vector<double> tail_mem_, q_, mq_, least_;
  std::array<std::vector<double>, 5> low_sum_, low_max_, tail_sum_, tail_max_;
  std::array<double, 8> pre_{};
  std::array<double, 3> used_{};
  std::array<int, 4> cuts_{};
  pipeline_best best_;
};

}  // namespace

pipeline_best search_pipeline(const pipeline_tables& t, double bound) {
  return searcher(t, bound).run();
}

double pipeline_seconds_of(const pipeline_tables& t, const std::vector<int>& cuts) {
  std::array<double, 9> s{};
  std::size_t ns = 0;
  for (int k = 0; k < t.n_segments; ++k) {
    const int b = k == 0 ? 0 : cuts[static_cast<std::size_t>(k - 1)];
    const int e = k + 1 == t.n_segments ? t.n : cuts[static_cast<std::size_t>(k)];
    s[ns++] = t.segment(k, b, e);
    if (k + 1 < t.n_segments) s[ns++] = t.hop[static_cast<std::size_t>(k)][static_cast<std::size_t>(e)];
  }
  return stages_seconds(s.data(), ns, t.m);
}

}  // namespace cleave::split::detail
