// The splitter's cost model against a simulation of the schedule the runtime follows: the device
// runs its M bottom forwards back to back, every node and link direction serves what reaches it
// in order, latency delays without occupying. The model is exact where only the device runs two
// stages and a lower bound of the simulated step everywhere.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <queue>
#include <tuple>
#include <vector>

#include "cleave/core/random.h"
#include "cleave/split/splitter.h"
#include "splitter_problems.h"

using namespace cleave;
using split::route;
using split::split_problem;

namespace {

// A stage of one micro-batch's way: the resource that serves it (0 device, 1 edge, 2 server,
// 3 + 2 * link + direction), its time, and the latency after it.
struct stage {
  int resource = 0;
  double seconds = 0, delay = 0;
};

int rank_of(core::tier t) {
  return t == core::tier::device ? 0 : t == core::tier::edge ? 1 : 2;
}

// Route r of device 0 (the only one: shares are 1) at m micro-batches, f32 both ways, unfolded:
// forwards and activations up the path, the last segment whole, gradients and backwards down.
std::vector<stage> unfold(const split_problem& p, const route& r, int m) {
  const auto& dev = p.devices[0];
  const double dm = static_cast<double>(m);
  auto node = [&](int k) -> const split::node_costs& {
    const auto t = r.path[static_cast<std::size_t>(k)];
    return t == core::tier::device ? dev.board : t == core::tier::edge ? p.edges[0] : p.server;
  };
  auto passes = [&](int k) {
    double f = 0, b = 0;
    for (int i = r.begin(k); i < r.end(k); ++i) {
      f += node(k).forward_seconds[static_cast<std::size_t>(i)];
      b += node(k).block_seconds[static_cast<std::size_t>(i)] - node(k).forward_seconds[static_cast<std::size_t>(i)];
    }
    return std::pair{f / dm, b / dm};
  };
  // Hop k from the tier at k to the one at k + 1 (forward: the activation) or back.
  auto hop = [&](int k, bool forward) {
    const auto a = r.path[static_cast<std::size_t>(k)], b = r.path[static_cast<std::size_t>(k + 1)];
    const bool device_link = a == core::tier::device || b == core::tier::device;
    const auto& l = device_link ? dev.link : p.edge_links[0];
    const bool up = (rank_of(a) < rank_of(b)) == forward;
    const double bytes = p.cut_bytes[static_cast<std::size_t>(r.end(k))];
    const double secs = l.bytes_per_second > 0 ? bytes / l.bytes_per_second / dm : 0.0;
    return stage{3 + 2 * (device_link ? 0 : 1) + (up ? 0 : 1), secs, l.rtt_seconds / 2};
  };
  // Every block on the device (off the U): its loss there too, nothing crosses a link.
  const int last = r.device_only() ? 0 : r.n_segments() - 1;
  std::vector<stage> out;
  for (int k = 0; k < last; ++k) {
    out.push_back({rank_of(r.path[static_cast<std::size_t>(k)]), passes(k).first, 0});
    out.push_back(hop(k, true));
  }
  const auto [f, b] = passes(last);
  out.push_back({rank_of(r.path[static_cast<std::size_t>(last)]), f + b, 0});
  for (int k = last - 1; k >= 0; --k) {
    out.push_back(hop(k, false));
    out.push_back({rank_of(r.path[static_cast<std::size_t>(k)]), passes(k).second, 0});
  }
  return out;
}

// The step: m micro-batches through the stages, every resource first come first served (the
// device's forwards all queued at 0, so they run first), ties in the order they were queued.
double simulate(const std::vector<stage>& stages, int m) {
  using event = std::tuple<double, long, int, std::size_t, bool>;  // time, order, job, stage, done
  std::priority_queue<event, std::vector<event>, std::greater<>> events;
  long order = 0;
  std::vector<std::deque<std::pair<int, std::size_t>>> waiting(7);
  std::vector<bool> busy(7, false);
  auto start = [&](int res, double now) {
    const auto [job, i] = waiting[static_cast<std::size_t>(res)].front();
    waiting[static_cast<std::size_t>(res)].pop_front();
    busy[static_cast<std::size_t>(res)] = true;
    events.emplace(now + stages[i].seconds, order++, job, i, true);
  };
  for (int j = 0; j < m; ++j) events.emplace(0.0, order++, j, 0, false);
  double end = 0;
  while (!events.empty()) {
    const auto [now, o, job, i, done] = events.top();
    events.pop();
    const int res = stages[i].resource;
    if (!done) {
      waiting[static_cast<std::size_t>(res)].emplace_back(job, i);
      if (!busy[static_cast<std::size_t>(res)]) start(res, now);
      continue;
    }
    busy[static_cast<std::size_t>(res)] = false;
    if (i + 1 < stages.size())
      events.emplace(now + stages[i].delay, order++, job, i + 1, false);
    else
      end = std::max(end, now);
    if (!waiting[static_cast<std::size_t>(res)].empty()) start(res, now);
  }
  return end;
}

// Times over three orders of magnitude, so that every stage is the bottleneck somewhere.
double spread(core::rng& r) {
  static const double scale[] = {0.1, 1.0, 10.0};
  return static_cast<double>(r.uniform()) * scale[r.below(3)];
}

// One device, straight to the server or through an edge, U-shaped or not, up to 5 blocks, every
// forward pass given.
split_problem schedule_problem(core::rng& r) {
  const bool u = r.below(2) == 1, edge = r.below(2) == 1;
  const int n = (u ? 2 : 1) + static_cast<int>(r.below(4));
  auto p = testing::blank(n, u, {edge ? 0 : -1}, edge ? 1 : 0);
  auto fill = [&](split::node_costs& c) {
    c.forward_seconds.clear();
    for (auto& b : c.block_seconds) {
      b = spread(r);
      c.forward_seconds.push_back(b * static_cast<double>(r.uniform()));
    }
  };
  fill(p.server);
  fill(p.devices[0].board);
  for (auto& e : p.edges) fill(e);
  for (auto& c : p.cut_bytes) c = spread(r);
  auto link = [&] {
    return split::link_costs{0.2 + static_cast<double>(r.uniform()), r.below(3) == 0 ? 0.0 : spread(r)};
  };
  p.devices[0].link = link();
  for (auto& l : p.edge_links) l = link();
  return p;
}

}  // namespace

TEST_CASE("the cost model is exact where only the device runs two stages and a lower bound of the runtime's schedule") {
  core::rng r(20261205);
  int n_exact_kind = 0, n_other = 0, n_other_exact = 0, n_within_5 = 0;
  double worst = 0;
  for (int it = 0; it < 3000; ++it) {
    const auto p = schedule_problem(r);
    const auto routes = testing::all_routes(p, 0);
    const route rt = routes[r.below(routes.size())];
    const int m = std::vector<int>{2, 3, 4, 8}[r.below(4)];
    const auto model =
        split::evaluate_route(p, 0, rt, split::route_choice{m, std::vector<core::hop_codecs>(rt.path.size() - 1)});
    const double sim = simulate(unfold(p, rt, m), m);
    CAPTURE(it);
    CAPTURE(rt.str());
    CAPTURE(m);
    CAPTURE(sim);
    CHECK(model.seconds <= sim * (1 + 1e-9));
    // D S, or D E S with nothing on the edge: only the device serves two stages.
    const bool device_only = !p.u_shape && (rt.path.size() == 2 || rt.begin(1) == rt.end(1));
    const bool exact = std::abs(model.seconds - sim) <= 1e-9 * sim;
    if (device_only) {
      CHECK(exact);
      ++n_exact_kind;
      continue;
    }
    ++n_other;
    n_other_exact += exact;
    n_within_5 += model.seconds >= 0.95 * sim;
    worst = std::max(worst, 1 - model.seconds / sim);
  }
  MESSAGE("routes where only the device serves two stages "
          << n_exact_kind << " (all exact); others " << n_other << ": exact " << n_other_exact << ", within 5% "
          << n_within_5 << ", at worst " << worst * 100 << "% below the simulated step");
  CHECK(n_exact_kind > 500);
  CHECK(n_other > 1000);
}
