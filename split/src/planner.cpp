// The adaptive splitter's exact planner: dynamic programming over the chain of blocks and the
// path of tiers, each device within its memory shares (see splitter.h; the oracle is in
// splitter.cpp and the floating-point discipline both follow is stated there).
#include <optional>

#include "cleave/core/error.h"
#include "cost_terms.h"

namespace cleave::split {

using namespace detail;

namespace {

// sums(b, e): the values of blocks [b, e) added from b upward starting at 0 (as the oracle does).
class sums {
 public:
  void build(const std::vector<double>& v) {
    n_ = static_cast<int>(v.size());
    s_.assign(static_cast<std::size_t>((n_ + 1) * (n_ + 1)), 0.0);
    for (int b = 0; b < n_; ++b) {
      double acc = 0;
      for (int e = b + 1; e <= n_; ++e) {
        acc += v[static_cast<std::size_t>(e - 1)];
        s_[idx(b, e)] = acc;
      }
    }
  }
  double operator()(int b, int e) const { return s_[idx(b, e)]; }

 private:
  std::size_t idx(int b, int e) const { return static_cast<std::size_t>(b * (n_ + 1) + e); }
  int n_ = 0;
  std::vector<double> s_;
};

// Tables shared by every device of a problem.
struct shared_tables {
  sums mem;  // fixed + saved bytes
  sums server;
  std::vector<sums> edges;
};

shared_tables build_shared(const split_problem& p) {
  shared_tables t;
  std::vector<double> m(static_cast<std::size_t>(p.n_blocks));
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = p.fixed_bytes[i] + p.saved_bytes[i];
  t.mem.build(m);
  t.server.build(p.server.block_seconds);
  t.edges.resize(p.edges.size());
  for (std::size_t e = 0; e < p.edges.size(); ++e) t.edges[e].build(p.edges[e].block_seconds);
  return t;
}

// One device's view: per path position the node's time table, share and memory share, and per hop
// the hop's price at every cut.
class device_planner {
 public:
  device_planner(const split_problem& p, int d, const shared_tables& shared, sums& board)
      : p_(p), n_(p.n_blocks), path_(path_of(p, d)), mem_(shared.mem) {
    board.build(dev_of(p, d).board.block_seconds);
    for (std::size_t k = 0; k < path_.size(); ++k) {
      const core::tier t = path_[k];
      const sums* secs = t == core::tier::device ? &board
                         : t == core::tier::edge ? &shared.edges[static_cast<std::size_t>(dev_of(p, d).edge)]
                                                 : &shared.server;
      const double share = share_of(p, d, t);
      nodes_.push_back({secs, share, cap_of(node_of(p, d, t).memory_budget, share)});
      if (k + 1 < path_.size()) {
        const auto& link = link_between(p, d, t, path_[k + 1]);
        std::vector<double> h(static_cast<std::size_t>(n_ + 1));
        for (int c = 0; c <= n_; ++c)
          h[static_cast<std::size_t>(c)] =
              hop_seconds(link, p.cut_bytes[static_cast<std::size_t>(c)], p.n_micro_batches);
        hops_.push_back(std::move(h));
      }
    }
  }

  // The cheapest feasible cuts, smallest lexicographically among equals; nullopt if none fits.
  std::optional<std::vector<int>> best() const {
    if (!p_.u_shape) return best_chain();
    return path_.size() == 3 ? best_u2() : best_u3();
  }

 private:
  struct node {
    const sums* secs;
    double share, cap;
  };

  double seg(int k, int b, int e) const {
    const auto& nd = nodes_[static_cast<std::size_t>(k)];
    return (*nd.secs)(b, e) * nd.share;
  }
  double hop(int k, int c) const { return hops_[static_cast<std::size_t>(k)][static_cast<std::size_t>(c)]; }
  double cap(int k) const { return nodes_[static_cast<std::size_t>(k)].cap; }

  // The total of a route whose leading terms are `fixed` (seg_0, hop_0, ...) and whose remaining
  // terms add up to `rest`, in the oracle's order.
  static double nest(const std::vector<double>& fixed, double rest) {
    for (auto it = fixed.rbegin(); it != fixed.rend(); ++it) rest = *it + rest;
    return rest;
  }

  // D S and D E S: every tier once, so memory is per segment. g[k][c]: least cost of positions
  // k.. when segment k starts at block c. O(path * n^2).
  std::optional<std::vector<int>> best_chain() const {
    const int last = static_cast<int>(path_.size()) - 1;
    const std::size_t w = static_cast<std::size_t>(n_ + 1);
    std::vector<std::vector<double>> g(path_.size(), std::vector<double>(w, unlimited));
    for (int c = 0; c <= n_; ++c)
      if (mem_(c, n_) <= cap(last)) g[static_cast<std::size_t>(last)][static_cast<std::size_t>(c)] = seg(last, c, n_);
    auto step = [&](int k, int c, int e) {  // cost of positions k.. with segment k = [c, e)
      return seg(k, c, e) + (hop(k, e) + g[static_cast<std::size_t>(k + 1)][static_cast<std::size_t>(e)]);
    };
    for (int k = last - 1; k >= 0; --k) {
      for (int c = 0; c <= (k == 0 ? 0 : n_); ++c) {
        double best = unlimited;
        for (int e = std::max(c, k == 0 ? 1 : 0); e <= n_; ++e) {
          if (mem_(c, e) > cap(k)) break;  // grows with e
          best = std::min(best, step(k, c, e));
        }
        g[static_cast<std::size_t>(k)][static_cast<std::size_t>(c)] = best;
      }
    }
    const double m = g[0][0];
    if (m == unlimited) return std::nullopt;
    // Smallest cut first: the least total with this cut is reached, so a cheapest completion exists.
    std::vector<int> cuts;
    std::vector<double> fixed;
    int c = 0;
    for (int k = 0; k < last; ++k) {
      int chosen = -1;
      for (int e = std::max(c, k == 0 ? 1 : 0); e <= n_ && chosen < 0; ++e) {
        if (mem_(c, e) > cap(k)) break;
        if (nest(fixed, step(k, c, e)) <= m) chosen = e;
      }
      CLEAVE_ASSERT(chosen >= 0, "split planner lost its optimum");
      fixed.push_back(seg(k, c, chosen));
      fixed.push_back(hop(k, chosen));
      cuts.push_back(chosen);
      c = chosen;
    }
    return cuts;
  }

  // D S D: the board's share holds both device segments. For each bottom cut c0 the top cut c1 is
  // searched directly: O(n^2).
  std::optional<std::vector<int>> best_u2() const {
    std::vector<double> top(static_cast<std::size_t>(n_));  // hop_1 + seg_2 for top cut c1
    for (int c1 = 1; c1 < n_; ++c1) top[static_cast<std::size_t>(c1)] = hop(1, c1) + seg(2, c1, n_);
    auto fits = [&](int c0, int c1) { return mem_(c0, c1) <= cap(1) && mem_(0, c0) + mem_(c1, n_) <= cap(0); };
    auto tail = [&](int c0, int c1) { return seg(1, c0, c1) + top[static_cast<std::size_t>(c1)]; };
    double m = unlimited;
    int best_c0 = -1;
    for (int c0 = 1; c0 < n_; ++c0) {
      if (mem_(0, c0) > cap(0)) break;
      double least = unlimited;
      for (int c1 = c0; c1 < n_; ++c1) {
        if (mem_(c0, c1) > cap(1)) break;
        if (fits(c0, c1)) least = std::min(least, tail(c0, c1));
      }
      const double total = seg(0, 0, c0) + (hop(0, c0) + least);
      if (total < m) m = total, best_c0 = c0;
    }
    if (m == unlimited) return std::nullopt;
    const std::vector<double> fixed{seg(0, 0, best_c0), hop(0, best_c0)};
    for (int c1 = best_c0; c1 < n_; ++c1)
      if (fits(best_c0, c1) && nest(fixed, tail(best_c0, c1)) <= m) return std::vector<int>{best_c0, c1};
    CLEAVE_ASSERT(false, "split planner lost its optimum");
    return std::nullopt;
  }

  // D E S E D: the board holds segments 0 and 4, the edge's share segments 1 and 3. The first
  // visits (c0, c1) are enumerated; the rest is minimised under the memory they leave:
  //   device top [c3, n) fits iff c3 >= lo(c0), the second edge segment [c2, c3) iff c3 <= hi(c2),
  // where hi grows with c2. val(c2, c3) = seg_3 + (hop_3 + seg_4) does not depend on (c0, c1), so
  // for each c0 running minima of val over c3 from lo(c0) answer each (c1, c2) in O(1): O(n^3).
  std::optional<std::vector<int>> best_u3() const {
    const std::size_t w = static_cast<std::size_t>(n_ + 1);
    std::vector<double> val(w * w, unlimited), run(w * w, unlimited);
    auto at = [w](int a, int b) { return static_cast<std::size_t>(a) * w + static_cast<std::size_t>(b); };
    for (int c3 = 1; c3 < n_; ++c3) {
      const double q = hop(3, c3) + seg(4, c3, n_);
      for (int c2 = 1; c2 <= c3; ++c2) val[at(c2, c3)] = seg(3, c2, c3) + q;
    }
    // Smallest c3 (>= from) whose device top fits beside the bottom [0, c0); n if none.
    auto lowest_top = [&](int c0, int from) {
      int c3 = from;
      while (c3 < n_ && mem_(0, c0) + mem_(c3, n_) > cap(0)) ++c3;
      return c3;
    };
    // Largest c3 (>= c2, <= n-1) whose second edge segment fits beside the first, which holds a bytes.
    auto widen = [&](double a, int c2, int c3) {
      c3 = std::max(c3, c2);
      while (c3 + 1 < n_ && a + mem_(c2, c3 + 1) <= cap(1)) ++c3;
      return c3;
    };
    auto head = [&](int c0, int c1) {
      return std::vector<double>{seg(0, 0, c0), hop(0, c0), seg(1, c0, c1), hop(1, c1)};
    };

    double m = unlimited;
    int best_c0 = -1, best_c1 = -1;
    for (int c0 = 1; c0 < n_; ++c0) {
      if (mem_(0, c0) > cap(0)) break;
      const int lo = lowest_top(c0, c0);
      if (lo >= n_) continue;
      for (int c2 = c0; c2 < n_; ++c2) {
        double r = unlimited;
        for (int c3 = std::max(c2, lo); c3 < n_; ++c3) run[at(c2, c3)] = r = std::min(r, val[at(c2, c3)]);
      }
      for (int c1 = c0; c1 < n_; ++c1) {
        const double a = mem_(c0, c1);
        if (a > cap(1)) break;
        double least = unlimited;
        int hi = c1;
        for (int c2 = c1; c2 < n_; ++c2) {
          if (mem_(c1, c2) > cap(2)) break;
          hi = widen(a, c2, hi);
          if (std::max(c2, lo) > hi) continue;
          least = std::min(least, seg(2, c1, c2) + (hop(2, c2) + run[at(c2, hi)]));
        }
        const double total =
            seg(0, 0, c0) + (hop(0, c0) + (seg(1, c0, c1) + (hop(1, c1) + least)));  // nest(head(c0, c1), least)
        if (total < m) m = total, best_c0 = c0, best_c1 = c1;
      }
    }
    if (m == unlimited) return std::nullopt;

    const int c0 = best_c0, c1 = best_c1, lo = lowest_top(c0, c0);
    const double a = mem_(c0, c1);
    std::vector<double> fixed = head(c0, c1);
    for (int c2 = c1; c2 < n_; ++c2) {
      if (mem_(c1, c2) > cap(2)) break;
      const int hi = widen(a, c2, c2);
      double least = unlimited;
      for (int c3 = std::max(c2, lo); c3 <= hi; ++c3) least = std::min(least, val[at(c2, c3)]);
      if (nest(fixed, seg(2, c1, c2) + (hop(2, c2) + least)) > m) continue;
      fixed.push_back(seg(2, c1, c2));
      fixed.push_back(hop(2, c2));
      for (int c3 = std::max(c2, lo); c3 <= hi; ++c3)
        if (nest(fixed, val[at(c2, c3)]) <= m) return std::vector<int>{c0, c1, c2, c3};
      break;
    }
    CLEAVE_ASSERT(false, "split planner lost its optimum");
    return std::nullopt;
  }

  const split_problem& p_;
  int n_;
  std::vector<core::tier> path_;
  const sums& mem_;
  std::vector<node> nodes_;
  std::vector<std::vector<double>> hops_;
};

}  // namespace

split_plan plan_best(const split_problem& p) {
  validate(p);
  const auto shared = build_shared(p);
  sums board;
  split_plan out;
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const int di = static_cast<int>(d);
    const device_planner planner(p, di, shared, board);
    const auto cuts = planner.best();
    if (!cuts) throw_infeasible(p, di);
    out.routes.push_back(route{path_of(p, di), *cuts, p.n_blocks});
  }
  out.cost = assemble(p, out.routes);
  return out;
}

}  // namespace cleave::split
