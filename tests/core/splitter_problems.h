// Problems for the splitter's tests: blank ones to fill by hand and random small ones, with or
// without micro-batch and codec options, and every route of a device.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cleave/core/error.h"
#include "cleave/core/random.h"
#include "cleave/split/splitter.h"

namespace cleave::testing {

using split::route;
using split::split_problem;

// n blocks, one device per entry of `edges` (its edge index or -1), every time 0, every budget and
// link unlimited: tests set what they need.
inline split_problem blank(int n, bool u_shape, const std::vector<int>& edges, int n_edges) {
  split_problem p;
  p.n_blocks = n;
  p.u_shape = u_shape;
  const auto un = static_cast<std::size_t>(n);
  p.cut_bytes.assign(un + 1, 0.0);
  p.fixed_bytes.assign(un, 0.0);
  p.saved_bytes.assign(un, 0.0);
  p.server.block_seconds.assign(un, 0.0);
  p.edges.assign(static_cast<std::size_t>(n_edges), split::node_costs{std::vector<double>(un, 0.0), 0});
  p.edge_links.assign(static_cast<std::size_t>(n_edges), split::link_costs{});
  for (int e : edges) {
    split::device_costs d;
    d.board.block_seconds.assign(un, 0.0);
    d.edge = e;
    p.devices.push_back(d);
  }
  return p;
}

// Small integers often (exact ties, zero-cost blocks), otherwise a fraction.
inline double draw(core::rng& r, int max_int) {
  if (r.below(3) != 0) return static_cast<double>(r.below(static_cast<std::uint64_t>(max_int) + 1));
  return r.uniform(0.0f, static_cast<float>(max_int));
}

// Up to max_blocks blocks (at least 2 in U-shape) and max_devices devices.
inline split_problem random_problem(core::rng& r, int max_blocks = 7, int max_devices = 4) {
  const bool u = r.below(2) == 1;
  const auto up_to = static_cast<std::uint64_t>(max_blocks);
  const int n = u ? 2 + static_cast<int>(r.below(up_to - 1)) : 1 + static_cast<int>(r.below(up_to));
  const int n_edges = static_cast<int>(r.below(3));
  const int n_dev = 1 + static_cast<int>(r.below(static_cast<std::uint64_t>(max_devices)));
  std::vector<int> edges;
  for (int d = 0; d < n_dev; ++d)
    edges.push_back(n_edges > 0 && r.below(2) == 1 ? static_cast<int>(r.below(static_cast<std::uint64_t>(n_edges)))
                                                   : -1);
  split_problem p = blank(n, u, edges, n_edges);
  p.n_micro_batches = 1 + static_cast<int>(r.below(3));
  for (auto& b : p.cut_bytes) b = draw(r, 8);
  double total = 0;
  for (std::size_t i = 0; i < p.fixed_bytes.size(); ++i) {
    p.fixed_bytes[i] = draw(r, 4);
    p.saved_bytes[i] = draw(r, 3);
    total += p.fixed_bytes[i] + p.saved_bytes[i];
  }
  // Unlimited two times in three; otherwise from nothing to the whole model times the share: sometimes
  // binding, sometimes too small for any route.
  auto budget = [&](double share) {
    return r.below(3) != 0 ? 0.0
                           : std::max(0.5, std::floor(static_cast<double>(r.uniform(0.2f, 1.5f)) * total * share));
  };
  auto link = [&] {
    split::link_costs l;
    const auto k = r.below(4);
    l.bytes_per_second = k == 0 ? 0.0 : k == 1 ? 1.0 : k == 2 ? 4.0 : r.uniform(0.5f, 8.0f);
    l.rtt_seconds = r.below(2) == 0 ? 0.0 : draw(r, 2);
    return l;
  };
  for (auto& t : p.server.block_seconds) t = draw(r, 3);
  p.server.memory_budget = budget(n_dev);
  for (std::size_t e = 0; e < p.edges.size(); ++e) {
    for (auto& t : p.edges[e].block_seconds) t = draw(r, 6);
    p.edges[e].memory_budget = budget(2);
    p.edge_links[e] = link();
  }
  for (auto& d : p.devices) {
    for (auto& t : d.board.block_seconds) t = draw(r, 12);
    d.board.memory_budget = budget(1);
    d.link = link();
  }
  return p;
}

// Every route of device d, in lexicographic order of the cuts.
inline std::vector<route> all_routes(const split_problem& p, int d) {
  const bool edge = p.devices[static_cast<std::size_t>(d)].edge >= 0;
  const std::size_t n_cuts = split::path_of(p, d).size() - 1;
  std::vector<route> out;
  std::vector<int> cuts(n_cuts, 0);
  const int n = p.n_blocks;
  // Odometer over [0, n]^n_cuts, lexicographic; make_route rejects the invalid ones (the cheap
  // test of order first: exceptions are slow).
  for (;;) {
    if (std::is_sorted(cuts.begin(), cuts.end())) {
      try {
        out.push_back(split::make_route(p.u_shape, edge, cuts, n));
      } catch (const core::error&) {
      }
    }
    std::size_t k = n_cuts;
    while (k > 0 && cuts[k - 1] == n) cuts[--k] = 0;
    if (k == 0) break;
    ++cuts[k - 1];
  }
  return out;
}

// random_problem (at most 6 blocks and 3 devices) with micro-batch options (a subset of {1, 2, 4},
// in any order), sometimes a batch they divide, 2 to 4 codecs with small compute costs,
// sometimes channels, a larger topk fraction or longer round trips.
inline split_problem random_choice_problem(core::rng& r) {
  split_problem p = random_problem(r, 6, 3);
  std::vector<int> m;
  while (m.empty())
    for (int v : {1, 2, 4})
      if (r.below(2) == 1) m.push_back(v);
  if (r.below(2) == 1) std::reverse(m.begin(), m.end());
  p.micro_batch_options = m;
  p.n_micro_batches = m.front();
  p.batch = r.below(2) == 1 ? 8 : 0;
  const int n_codecs = 2 + static_cast<int>(r.below(3));
  std::vector<core::codec> pool{core::codec::f32, core::codec::f16, core::codec::bf16, core::codec::int8,
                                core::codec::topk};
  for (int i = 0; i < n_codecs; ++i) {
    const auto k = static_cast<std::size_t>(r.below(pool.size()));
    const double cost = r.below(3) == 0 ? 0.0 : draw(r, 2) * 0.25;
    p.codecs.push_back({pool[k], cost});
    pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(k));
  }
  if (r.below(2) == 1) {
    p.cut_channels.resize(p.cut_bytes.size());
    for (auto& c : p.cut_channels) c = 1.0 + static_cast<double>(r.below(3));
  }
  if (r.below(3) == 0) p.topk_fraction = 0.5f;
  // Longer round trips half the time: they are paid per micro-batch, so fewer micro-batches win.
  if (r.below(2) == 1) {
    for (auto& l : p.edge_links) l.rtt_seconds += draw(r, 4);
    for (auto& d : p.devices) d.link.rtt_seconds += draw(r, 4);
  }
  // Measured forward passes half the time: none, all or part of a block, in quarters (exact ties).
  if (r.below(2) == 1) {
    auto forward = [&](split::node_costs& n) {
      n.forward_seconds.clear();
      for (const double b : n.block_seconds) n.forward_seconds.push_back(b * static_cast<double>(r.below(5)) / 4.0);
    };
    forward(p.server);
    for (auto& e : p.edges) forward(e);
    for (auto& d : p.devices) forward(d.board);
  }
  return p;
}

// plan_best and plan_exhaustive of one problem, each with the error it threw ("" if none).
struct both_plans {
  split::split_plan best, all;
  std::string best_err, all_err;
};
inline both_plans plan_both(const split_problem& p) {
  both_plans b;
  try {
    b.best = split::plan_best(p);
  } catch (const core::error& e) {
    b.best_err = e.what();
  }
  try {
    b.all = split::plan_exhaustive(p);
  } catch (const core::error& e) {
    b.all_err = e.what();
  }
  return b;
}

}  // namespace cleave::testing
