// Tables the planner (planner.cpp) and its pipeline search (pipeline_search.cpp) share: prefix
// sums over the chain of blocks and one device's stage times at one micro-batch count.
#pragma once

#include <array>
#include <vector>

#include "cost_terms.h"

namespace cleave::split::detail {

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
  // Row b: sums(b, e) at [e].
  const double* row(int b) const { return s_.data() + idx(b, 0); }

 private:
  std::size_t idx(int b, int e) const { return static_cast<std::size_t>(b * (n_ + 1) + e); }
  int n_ = 0;
  std::vector<double> s_;
};

// A node's block times as sums: whole blocks, forward passes and backward passes.
struct node_sums {
  sums total, fwd, bwd;
  void build(const node_costs& n) {
    std::vector<double> f(n.block_seconds.size()), b(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) f[i] = forward_of(n, i), b[i] = backward_of(n, i);
    total.build(n.block_seconds);
    fwd.build(f);
    bwd.build(b);
  }
};

// A shared node's middle segments at one micro-batch count: (n + 1) x (n + 1) row-major tables,
// [b * (n + 1) + e] = [b, e): the segment's stage and its longer pass.
struct middle_table {
  std::vector<double> stage, top;
};

// One device's route at one micro-batch count m, as stage times per micro-batch. Segment k of
// the path runs on node node_of_segment[k] (0 device, 1 edge, 2 server); hop k's directions are
// the fastest codec each way.
struct pipeline_tables {
  int n = 0, n_segments = 0, m = 1;
  int min_first = 1;  // the least first cut (the device keeps at least this many blocks)
  bool u_shape = false;
  std::vector<double> first;      // first[e]: segment 0 = [0, e)
  std::vector<double> first_top;  // its longer pass
  std::vector<double> last;       // last[b]: the last segment = [b, n), one stage
  // Segment 0's passes before the share and M: the board's sums of [0, e).
  const std::vector<double>*first_fwd = nullptr, *first_bwd = nullptr;
  // Segments 1 .. n_segments - 2: their node's tables, and (for the busy bounds of a whole route)
  // its forward and backward sums and share.
  std::array<const middle_table*, 5> middle{};
  std::array<const node_sums*, 5> passes{};
  std::array<double, 5> share{};
  // block[k][i]: block i alone as segment k; its passes (segments below the last only).
  std::array<std::vector<double>, 5> block, block_fwd, block_bwd;
  std::array<std::vector<double>, 4> hop, hop_top;  // at cut c: up + down, the longer direction
  // At cut c, before M: the fastest codec's time up and down (direction_total).
  std::array<const std::vector<double>*, 4> up_total{}, down_total{};
  std::array<double, 4> rtt{};
  double latency = 0;         // the round trips, added as time_of adds them
  const sums* mem = nullptr;  // fixed + saved bytes
  std::array<int, 5> node_of_segment{};
  std::array<double, 3> cap{};  // memory share per node

  double segment(int k, int b, int e) const {
    if (k == 0) return first[static_cast<std::size_t>(e)];
    if (k + 1 == n_segments) return last[static_cast<std::size_t>(b)];
    return middle[static_cast<std::size_t>(k)]->stage[static_cast<std::size_t>(b * (n + 1) + e)];
  }
  // The longest stage of segment k = [b, e): its longer pass, or the whole of the last segment.
  double segment_top(int k, int b, int e) const {
    if (k == 0) return first_top[static_cast<std::size_t>(e)];
    if (k + 1 == n_segments) return last[static_cast<std::size_t>(b)];
    return middle[static_cast<std::size_t>(k)]->top[static_cast<std::size_t>(b * (n + 1) + e)];
  }
  // The largest cut a route may place (U-shape: the device top holds a block).
  int max_cut() const { return u_shape ? n - 1 : n; }
  // The largest first cut the search places: the device-only route (first cut n) has no hops
  // and is priced apart (planner.cpp).
  int max_first() const { return n - 1; }
  int max_at(int k) const { return k == 0 ? max_first() : max_cut(); }
  // Every term of the route with these cuts (n_segments - 1 of them), as the oracle makes them.
  route_terms terms(const int* cuts) const;
  double seconds(const int* cuts) const { return time_of(terms(cuts)).seconds; }
};

struct pipeline_best {
  double seconds = unlimited;
  std::vector<int> cuts;  // empty: nothing below the bound
};

// The first route (cuts in lexicographic order) of least T under t among those within memory,
// considering only routes whose T is <= bound (routes above it are pruned).
pipeline_best search_pipeline(const pipeline_tables& t, double bound);
// T of the given cuts under t (memory not checked).
double pipeline_seconds_of(const pipeline_tables& t, const std::vector<int>& cuts);

}  // namespace cleave::split::detail
