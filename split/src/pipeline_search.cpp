// The planner's search for M > 1 micro-batches: with T = sum_i s_i + (M - 1) * max_i s_i the cost
// is no longer a sum over the chain, so the dynamic programme of planner.cpp does not apply.
// Instead the cuts are enumerated depth first in lexicographic order (cut 0, then cut 1, ...),
// and a prefix is dropped as soon as a lower bound of every route extending it reaches the best
// T found so far (a later route of equal T would lose the tie anyway) or exceeds the caller's
// bound. The bound of a suffix starting with segment k at cut c, relaxing memory and taking
// segment k as free:
//   low_sum[k][c] = min over e >= c of hop_k(e) + low_sum[k+1][e],  low_sum[last][c] = last(c)
//   low_max[k][c] = min over e >= c of max(hop_k(e), low_max[k+1][e])
// so that a prefix's bound is its stages followed by s_k, hop_k and low_sum[k+1] added in the
// oracle's order, plus (M - 1) * max(its stages, low_max[k+1]). Every term is below the true one
// and the operations are monotone, so the bound holds in floating point too (splitter.cpp).
#include <algorithm>

#include "planner_tables.h"

namespace cleave::split::detail {

namespace {

class searcher {
 public:
  searcher(const pipeline_tables& t, double bound) : t_(t), bound_(bound), k_last_(t.n_segments - 1) {
    const auto w = static_cast<std::size_t>(t.n + 1);
    const int cm = t.max_cut();
    tail_mem_.resize(w);
    for (int c = 0; c <= t.n; ++c) tail_mem_[static_cast<std::size_t>(c)] = (*t.mem)(c, t.n);
    low_sum_[static_cast<std::size_t>(k_last_)] = t.last;
    low_max_[static_cast<std::size_t>(k_last_)] = t.last;
    for (int k = k_last_ - 1; k >= 1; --k) {
      auto& ls = low_sum_[static_cast<std::size_t>(k)];
      auto& lm = low_max_[static_cast<std::size_t>(k)];
      const auto& ns = low_sum_[static_cast<std::size_t>(k + 1)];
      const auto& nm = low_max_[static_cast<std::size_t>(k + 1)];
      const auto& h = t.hop[static_cast<std::size_t>(k)];
      ls.assign(w, unlimited);
      lm.assign(w, unlimited);
      double rs = unlimited, rm = unlimited;
      for (int c = cm; c >= 0; --c) {
        const auto i = static_cast<std::size_t>(c);
        rs = std::min(rs, h[i] + ns[i]);
        rm = std::min(rm, std::max(h[i], nm[i]));
        ls[i] = rs;
        lm[i] = rm;
      }
    }
    const auto& h = t.hop[static_cast<std::size_t>(k_last_ - 1)];
    q_.resize(w);
    mq_.resize(w);
    for (std::size_t c = 0; c < w; ++c) {
      q_[c] = h[c] + t.last[c];
      mq_[c] = std::max(h[c], t.last[c]);
    }
  }

  pipeline_best run() {
    if (k_last_ == 1)
      leaf(0, 0, 0.0);
    else
      level(0, 0, 0, 0.0);
    return best_;
  }

 private:
  // The prefix's stages pre_[0 .. np) added to `rest` in the oracle's order.
  double fold(int np, double rest) const {
    for (int j = np - 1; j >= 0; --j) rest = pre_[static_cast<std::size_t>(j)] + rest;
    return rest;
  }

  // Cut k (segment k = [b, c)) for k below the last cut; np stages fixed so far, their max pmax.
  void level(int k, int b, int np, double pmax) {
    const int node = t_.node_of_segment[static_cast<std::size_t>(k)];
    const double used = used_[static_cast<std::size_t>(node)], cap = t_.cap[static_cast<std::size_t>(node)];
    const double* mem = t_.mem->row(b);
    const auto& ls = low_sum_[static_cast<std::size_t>(k + 1)];
    const auto& lm = low_max_[static_cast<std::size_t>(k + 1)];
    const auto& hop = t_.hop[static_cast<std::size_t>(k)];
    for (int c = std::max(b, 1); c <= t_.max_cut(); ++c) {
      const auto i = static_cast<std::size_t>(c);
      if (used + mem[i] > cap) break;  // grows with c
      const double s = t_.segment(k, b, c), h = hop[i];
      const double low = pipeline_seconds(fold(np, s + (h + ls[i])), std::max({pmax, s, h, lm[i]}), t_.m);
      if (low >= best_.seconds || low > bound_) continue;
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
    int c = std::max(b, 1);
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
      }
    }
  }

  const pipeline_tables& t_;
  const double bound_;
  const int k_last_;
  std::vector<double> tail_mem_, q_, mq_;
  std::array<std::vector<double>, 5> low_sum_, low_max_;
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
