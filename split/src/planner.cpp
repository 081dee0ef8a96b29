// The adaptive splitter's exact planner (see splitter.h; the oracle is in splitter.cpp and the
// floating-point discipline all follow is stated there). Per device and per micro-batch count M
// (largest first, so that its optimum bounds the other searches), the least T over the cuts
// within the memory shares, the hop stages priced at the fastest codec each way: by dynamic
// programming over the chain of blocks and the path of tiers for M = 1 on the U-shaped path
// through an edge (O(n^3)), by the pruned search of pipeline_search.cpp otherwise. Then the
// first codecs, in tie-break order, that reach that T.
#include <map>
#include <optional>

#include "cleave/core/error.h"
#include "planner_tables.h"

namespace cleave::split {

using namespace detail;

namespace {

// Tables shared by every device of a problem.
struct shared_tables {
  sums mem;  // fixed + saved bytes
  node_sums server;
  std::vector<node_sums> edges;
};

shared_tables build_shared(const split_problem& p) {
  shared_tables t;
  std::vector<double> m(static_cast<std::size_t>(p.n_blocks));
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = p.fixed_bytes[i] + p.saved_bytes[i];
  t.mem.build(m);
  t.server.build(p.server);
  t.edges.resize(p.edges.size());
  for (std::size_t e = 0; e < p.edges.size(); ++e) t.edges[e].build(p.edges[e]);
  return t;
}

// The dynamic programme for one micro-batch (T = the sum of the stages) on the U-shaped path
// through an edge, O(n^3) where the search of pipeline_search.cpp enumerates four cuts: per path
// position the node's time table, share and memory share, and per hop the hop's stage at every cut.
class device_planner {
 public:
  // hops[k][c]: hop k's stage at cut c (one micro-batch, the fastest codecs); latency: the
  // path's round trips, as time_of adds them.
  device_planner(const split_problem& p, int d, const shared_tables& shared, const sums& board,
                 std::vector<std::vector<double>> hops, double latency)
      : p_(p), n_(p.n_blocks), path_(path_of(p, d)), mem_(shared.mem), hops_(std::move(hops)), latency_(latency) {
    for (std::size_t k = 0; k < path_.size(); ++k) {
      const core::tier t = path_[k];
      const sums* secs = t == core::tier::device ? &board
                         : t == core::tier::edge ? &shared.edges[static_cast<std::size_t>(dev_of(p, d).edge)].total
                                                 : &shared.server.total;
      const double share = share_of(p, d, t);
      nodes_.push_back({secs, share, cap_of(node_of(p, d, t).memory_budget, share)});
    }
  }

  // The cheapest feasible cuts, smallest lexicographically among equals; nullopt if none fits.
  std::optional<std::vector<int>> best() const {
    CLEAVE_ASSERT(path_.size() == 5, "the dynamic programme covers the U-shaped path through an edge");
    return best_u3();
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

  std::size_t at(int a, int b) const { return static_cast<std::size_t>(a * (n_ + 1) + b); }
  // Smallest c3 (>= from) whose device top fits beside the bottom [0, c0); n if none.
  int lowest_top(int c0, int from) const {
    int c3 = from;
    while (c3 < n_ && mem_(0, c0) + mem_(c3, n_) > cap(0)) ++c3;
    return c3;
  }
  // Largest c3 (>= c2, <= n-1) whose second edge segment fits beside the first, which holds a bytes.
  int widen(double a, int c2, int c3) const {
    c3 = std::max(c3, c2);
    while (c3 + 1 < n_ && a + mem_(c2, c3 + 1) <= cap(1)) ++c3;
    return c3;
  }

  // D E S E D: the board holds segments 0 and 4, the edge's share segments 1 and 3. The first
  // visits (c0, c1) are enumerated; the rest is minimised under the memory they leave:
  //   device top [c3, n) fits iff c3 >= lo(c0), the second edge segment [c2, c3) iff c3 <= hi(c2),
  // where hi grows with c2. val(c2, c3) = seg_3 + (hop_3 + seg_4) does not depend on (c0, c1), so
  // for each c0 running minima of val over c3 from lo(c0) answer each (c1, c2) in O(1): O(n^3).
  // T = sum + L: the least T is the least sum's, and the first cuts reaching it are found by
  // comparing sum + L (two sums may round to the same T).
  std::optional<std::vector<int>> best_u3() const {
    const std::size_t w = static_cast<std::size_t>(n_ + 1);
    std::vector<double> val(w * w, unlimited);
    for (int c3 = 1; c3 < n_; ++c3) {
      const double q = hop(3, c3) + seg(4, c3, n_);
      for (int c2 = 1; c2 <= c3; ++c2) val[at(c2, c3)] = seg(3, c2, c3) + q;
    }
    const std::vector<double> totals = first_visits(val);
    const double least = *std::min_element(totals.begin(), totals.end());
    if (least == unlimited) return std::nullopt;
    const double target = least + latency_;
    for (int c0 = 1; c0 < n_; ++c0)
      for (int c1 = c0; c1 < n_; ++c1)
        if (totals[at(c0, c1)] + latency_ <= target) return rest(val, c0, c1, target);
    CLEAVE_ASSERT(false, "split planner lost its optimum");
    return std::nullopt;
  }

  // totals[(c0, c1)]: the least sum of the routes whose first cuts are c0, c1 (unlimited: none fits).
  std::vector<double> first_visits(const std::vector<double>& val) const {
    std::vector<double> totals(val.size(), unlimited), run(val.size(), unlimited);
    for (int c0 = std::max(1, p_.min_device_blocks); c0 < n_; ++c0) {
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
        // nest({seg_0, hop_0, seg_1, hop_1}, least)
        totals[at(c0, c1)] = seg(0, 0, c0) + (hop(0, c0) + (seg(1, c0, c1) + (hop(1, c1) + least)));
      }
    }
    return totals;
  }

  // The first (c2, c3) after c0, c1 whose T reaches the target.
  std::vector<int> rest(const std::vector<double>& val, int c0, int c1, double target) const {
    const int lo = lowest_top(c0, c0);
    const double a = mem_(c0, c1);
    std::vector<double> fixed{seg(0, 0, c0), hop(0, c0), seg(1, c0, c1), hop(1, c1)};
    for (int c2 = c1; c2 < n_; ++c2) {
      if (mem_(c1, c2) > cap(2)) break;
      const int hi = widen(a, c2, c2);
      double least = unlimited;
      for (int c3 = std::max(c2, lo); c3 <= hi; ++c3) least = std::min(least, val[at(c2, c3)]);
      if (nest(fixed, seg(2, c1, c2) + (hop(2, c2) + least)) + latency_ > target) continue;
      fixed.push_back(seg(2, c1, c2));
      fixed.push_back(hop(2, c2));
      for (int c3 = std::max(c2, lo); c3 <= hi; ++c3)
        if (nest(fixed, val[at(c2, c3)]) + latency_ <= target) return {c0, c1, c2, c3};
      break;
    }
    CLEAVE_ASSERT(false, "split planner lost its optimum");
    return {};
  }

  const split_problem& p_;
  int n_;
  std::vector<core::tier> path_;
  const sums& mem_;
  std::vector<node> nodes_;
  std::vector<std::vector<double>> hops_;
  double latency_;
};

// Stage tables of the shared nodes' middle segments at one micro-batch count, built once for
// all the devices they serve. node: -1 the server, else an edge's index.
class middle_cache {
 public:
  middle_cache(const split_problem& p, const shared_tables& s) : p_(p), s_(s) {}
  const middle_table* get(int node, double share, int m) {
    auto& t = cache_[{node, m}];
    if (t.stage.empty()) {
      const node_sums& secs = node < 0 ? s_.server : s_.edges[static_cast<std::size_t>(node)];
      const int n = p_.n_blocks;
      t.stage.assign(static_cast<std::size_t>((n + 1) * (n + 1)), 0.0);
      t.top.assign(t.stage.size(), 0.0);
      for (int b = 0; b <= n; ++b)
        for (int e = b; e <= n; ++e) {
          const auto i = static_cast<std::size_t>(b * (n + 1) + e);
          t.stage[i] = segment_stage(secs.total(b, e) * share, m);
          t.top[i] = std::max(segment_stage(secs.fwd(b, e) * share, m), segment_stage(secs.bwd(b, e) * share, m));
        }
    }
    return &t;
  }
  const node_sums& sums_of(int node) const { return node < 0 ? s_.server : s_.edges[static_cast<std::size_t>(node)]; }

 private:
  const split_problem& p_;
  const shared_tables& s_;
  std::map<std::pair<int, int>, middle_table> cache_;
};

// Every codec's encoded bytes and compute at every cut, [cut * n_codecs + i].
struct codec_table {
  std::vector<codec_option> codecs;
  std::vector<double> bytes, seconds;
};

codec_table codec_table_of(const split_problem& p) {
  codec_table t{codec_options(p), {}, {}};
  for (int c = 0; c <= p.n_blocks; ++c)
    for (const auto& o : t.codecs) {
      const double numel = numel_at(p, c);
      t.bytes.push_back(core::encoded_bytes(o.id, numel, channels_at(p, c), p.topk_fraction));
      t.seconds.push_back(o.seconds_per_value * numel);
    }
  return t;
}

int tier_index(core::tier t) {
  return t == core::tier::device ? 0 : t == core::tier::edge ? 1 : 2;
}

// One device's search over cuts and micro-batch counts, then its codecs.
class device_search {
 public:
  device_search(const split_problem& p, int d, const shared_tables& shared, middle_cache& middle,
                const codec_table& codecs, sums& board)
      : p_(p), d_(d), shared_(shared), middle_(middle), codecs_(codecs), board_(board), path_(path_of(p, d)) {
    const node_costs& board_costs = dev_of(p, d).board;
    board_.build(board_costs.block_seconds);
    // Segment 0's passes: [0, e) only, added as sums does.
    double f = 0, b = 0;
    board_fwd_.assign(1, 0.0);
    board_bwd_.assign(1, 0.0);
    for (std::size_t i = 0; i < board_costs.block_seconds.size(); ++i) {
      board_fwd_.push_back(f += forward_of(board_costs, i));
      board_bwd_.push_back(b += backward_of(board_costs, i));
    }
    for (const core::tier t : path_) shares_.push_back(share_of(p, d, t));
    const std::size_t nc = codecs.codecs.size(), w = static_cast<std::size_t>(p.n_blocks + 1);
    for (std::size_t k = 0; k + 1 < path_.size(); ++k) {
      links_.push_back(&link_between(p, d, path_[k], path_[k + 1]));
      up_.emplace_back(w, unlimited);
      down_.emplace_back(w, unlimited);
      for (std::size_t c = 0; c < w; ++c)
        for (std::size_t i = 0; i < nc; ++i) {
          const double s = direction_total(*links_.back(), codecs.bytes[c * nc + i], codecs.seconds[c * nc + i]);
          if (core::codec_for_activations(codecs.codecs[i].id)) up_.back()[c] = std::min(up_.back()[c], s);
          down_.back()[c] = std::min(down_.back()[c], s);
        }
    }
  }

  // The first (cuts, M) of least T; false when no route fits in memory.
  bool run(const std::vector<int>& micro_options) {
    // Largest M first: it is most often the best, and bounds the others' searches early.
    for (auto it = micro_options.rbegin(); it != micro_options.rend(); ++it) {
      const int m = *it;
      pipeline_tables t = tables_at(m);
      // The device-only route (off the U), which the search leaves out: no hops, the loss on the
      // device. Its cuts come last in the tie order; its T bounds the search.
      pipeline_best local;
      if (!p_.u_shape && shared_.mem(0, p_.n_blocks) <= t.cap[0]) {
        local.cuts.assign(path_.size() - 1, p_.n_blocks);
        local.seconds = pipeline_seconds_of(t, local.cuts);
      }
      pipeline_best r;
      if (m == 1 && path_.size() == 5) {  // O(n^3) at worst where four cuts are enumerated
        std::vector<std::vector<double>> hops(t.hop.begin(), t.hop.begin() + static_cast<long>(path_.size() - 1));
        const auto cuts = device_planner(p_, d_, shared_, board_, std::move(hops), t.latency).best();
        if (cuts) r = {pipeline_seconds_of(t, *cuts), *cuts};
      } else {
        // The best cuts so far priced at m bound this m's optimum from above.
        const double bound =
            std::min(local.seconds,
                     best_.cuts.empty() ? best_.seconds : std::min(best_.seconds, pipeline_seconds_of(t, best_.cuts)));
        r = search_pipeline(t, bound);
      }
      if (!local.cuts.empty() && (r.cuts.empty() || local.seconds < r.seconds)) r = std::move(local);
      if (r.cuts.empty()) continue;
      // Ties: smaller cuts, then smaller M (this one, as M decreases).
      if (best_.cuts.empty() || r.seconds < best_.seconds || (r.seconds == best_.seconds && r.cuts <= best_.cuts)) {
        best_ = std::move(r);
        best_tables_ = std::move(t);
      }
    }
    return !best_.cuts.empty();
  }

  route best_route() const { return route{path_, best_.cuts, p_.n_blocks}; }
  route_choice best_choice() const;

 private:
  pipeline_tables tables_at(int m) {
    pipeline_tables t;
    const int n = p_.n_blocks;
    t.n = n;
    t.n_segments = static_cast<int>(path_.size());
    t.m = m;
    t.u_shape = p_.u_shape;
    t.min_first = std::max(1, p_.min_device_blocks);
    t.mem = &shared_.mem;
    const auto w = static_cast<std::size_t>(n + 1);
    t.first.resize(w);
    t.first_top.resize(w);
    t.last.resize(w);
    t.first_fwd = &board_fwd_;
    t.first_bwd = &board_bwd_;
    const double first_share = shares_.front();
    for (std::size_t e = 0; e < w; ++e) {
      t.first[e] = segment_stage(board_(0, static_cast<int>(e)) * first_share, m);
      t.first_top[e] =
          std::max(segment_stage(board_fwd_[e] * first_share, m), segment_stage(board_bwd_[e] * first_share, m));
    }
    const sums& top_secs = path_.back() == core::tier::device ? board_ : shared_.server.total;
    for (int b = 0; b <= n; ++b)
      t.last[static_cast<std::size_t>(b)] = segment_stage(top_secs(b, n) * shares_.back(), m);
    for (std::size_t k = 0; k < path_.size(); ++k) {
      const core::tier tier = path_[k];
      const double share = shares_[k];
      const node_costs& node = node_of(p_, d_, tier);
      t.node_of_segment[k] = tier_index(tier);
      t.share[k] = share;
      t.block[k].resize(node.block_seconds.size());
      for (std::size_t i = 0; i < t.block[k].size(); ++i)
        t.block[k][i] = segment_stage(node.block_seconds[i] * share, m);
      if (k + 1 < path_.size()) {
        t.block_fwd[k].resize(t.block[k].size());
        t.block_bwd[k].resize(t.block[k].size());
        for (std::size_t i = 0; i < t.block[k].size(); ++i) {
          t.block_fwd[k][i] = segment_stage(forward_of(node, i) * share, m);
          t.block_bwd[k][i] = segment_stage(backward_of(node, i) * share, m);
        }
      }
      t.cap[static_cast<std::size_t>(tier_index(tier))] = cap_of(node.memory_budget, share);
      if (k > 0 && k + 1 < path_.size()) {
        const int at = tier == core::tier::server ? -1 : dev_of(p_, d_).edge;
        t.middle[k] = middle_.get(at, share, m);
        t.passes[k] = &middle_.sums_of(at);
      }
    }
    for (std::size_t k = 0; k + 1 < path_.size(); ++k) {
      t.rtt[k] = links_[k]->rtt_seconds;
      t.up_total[k] = &up_[k];
      t.down_total[k] = &down_[k];
      t.hop[k].resize(w);
      t.hop_top[k].resize(w);
      for (std::size_t c = 0; c < w; ++c) {
        const double up = direction_seconds(up_[k][c], m), down = direction_seconds(down_[k][c], m);
        t.hop[k][c] = hop_stage(up, down);
        t.hop_top[k][c] = std::max(up, down);
      }
    }
    for (std::size_t k = path_.size() - 1; k-- > 0;) t.latency = t.rtt[k] + t.latency;  // as time_of adds it
    return t;
  }

  const split_problem& p_;
  int d_;
  const shared_tables& shared_;
  middle_cache& middle_;
  const codec_table& codecs_;
  sums& board_;
  std::vector<core::tier> path_;
  std::vector<double> board_fwd_, board_bwd_;  // [e]: the board's forward and backward sums of [0, e)
  std::vector<double> shares_;                 // per path position
  std::vector<const link_costs*> links_;
  std::vector<std::vector<double>> up_, down_;  // per hop and cut: the fastest codec's total each way
  pipeline_best best_;
  pipeline_tables best_tables_;
};

// The codecs of the best (cuts, M): the least T is reached with the fastest codec each way; among
// the codec sequences (hop 0 up, hop 0 down, ...) reaching it, the first lexicographically, chosen
// slot by slot (a slot's codec is kept when the fastest codecs in the later slots still reach T).
route_choice device_search::best_choice() const {
  const std::size_t nc = codecs_.codecs.size(), n_hops = path_.size() - 1;
  const int m = best_tables_.m;
  std::vector<double> dir(n_hops * nc);
  std::vector<std::size_t> slot(2 * n_hops, nc);
  for (std::size_t k = 0; k < n_hops; ++k) {
    const auto c = static_cast<std::size_t>(best_.cuts[k]);
    for (std::size_t i = 0; i < nc; ++i) {
      dir[k * nc + i] =
          direction_seconds(direction_total(*links_[k], codecs_.bytes[c * nc + i], codecs_.seconds[c * nc + i]), m);
      for (std::size_t j : {2 * k, 2 * k + 1}) {
        if (j == 2 * k && !core::codec_for_activations(codecs_.codecs[i].id)) continue;
        if (slot[j] == nc || dir[k * nc + i] < dir[k * nc + slot[j]]) slot[j] = i;
      }
    }
  }
  route_terms terms = best_tables_.terms(best_.cuts.data());
  auto total = [&] {
    for (std::size_t k = 0; k < n_hops; ++k)
      terms.up[k] = dir[k * nc + slot[2 * k]], terms.down[k] = dir[k * nc + slot[2 * k + 1]];
    return time_of(terms).seconds;
  };
  CLEAVE_ASSERT(total() == best_.seconds, "split planner lost its optimum");
  for (std::size_t j = 0; j < slot.size(); ++j) {
    const std::size_t fastest = slot[j];
    for (std::size_t i = 0; i < fastest; ++i) {
      if (j % 2 == 0 && !core::codec_for_activations(codecs_.codecs[i].id)) continue;
      slot[j] = i;
      if (total() <= best_.seconds) break;
      slot[j] = fastest;
    }
  }
  route_choice out{m, {}};
  for (std::size_t k = 0; k < n_hops; ++k)
    out.hops.push_back({codecs_.codecs[slot[2 * k]].id, codecs_.codecs[slot[2 * k + 1]].id});
  return out;
}

}  // namespace

split_plan plan_best(const split_problem& p) {
  validate(p);
  const auto shared = build_shared(p);
  const auto codecs = codec_table_of(p);
  const auto micro = micro_options(p);
  middle_cache middle(p, shared);
  sums board;
  split_plan out;
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const int di = static_cast<int>(d);
    device_search search(p, di, shared, middle, codecs, board);
    if (!search.run(micro)) throw_infeasible(p, di);
    out.routes.push_back(search.best_route());
    out.choices.push_back(search.best_choice());
  }
  out.cost = assemble(p, out.routes, out.choices);
  return out;
}

}  // namespace cleave::split
