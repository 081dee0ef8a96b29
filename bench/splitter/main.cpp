// Times the splitter's planner on random problems the size of a fleet (100 blocks, 64 devices) and
// against exhaustive search on a small one; prints plain lines of figures.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cleave/core/codec.h"
#include "cleave/core/random.h"
#include "cleave/split/splitter.h"

using namespace cleave;

namespace {

// n blocks; every device behind one of n_edges edges (none when 0); measured-looking figures:
// boards 1-10 ms a block, edges 4x and the server 20x faster, Wi-Fi-like device links, fast edge links.
split::split_problem random_problem(std::uint64_t seed, int n, int n_edges, int n_devices, bool u_shape) {
  core::rng r(seed);
  auto uni = [&](double a, double b) { return a + (b - a) * static_cast<double>(r.uniform()); };
  split::split_problem p;
  p.n_blocks = n;
  p.u_shape = u_shape;
  p.n_micro_batches = 4;
  const auto un = static_cast<std::size_t>(n);
  for (std::size_t c = 0; c <= un; ++c) p.cut_bytes.push_back(uni(1e4, 2e6));
  for (std::size_t i = 0; i < un; ++i) {
    p.fixed_bytes.push_back(uni(1e5, 8e6));
    p.saved_bytes.push_back(uni(1e5, 4e6));
  }
  std::vector<double> base(un);
  for (auto& b : base) b = uni(1e-3, 1e-2);
  auto scaled = [&](double f) {
    std::vector<double> v(un);
    for (std::size_t i = 0; i < un; ++i) v[i] = base[i] * f * uni(0.8, 1.25);
    return v;
  };
  p.server = {scaled(1.0 / 20), 80e9};
  for (int e = 0; e < n_edges; ++e) {
    p.edges.push_back({scaled(1.0 / 4), 8e9});
    p.edge_links.push_back({uni(5e8, 1.25e9), uni(2e-4, 1e-3)});
  }
  for (int d = 0; d < n_devices; ++d) {
    split::device_costs dev;
    dev.board = {scaled(uni(0.5, 2.0)), uni(1.5e8, 4e8)};
    dev.edge = n_edges > 0 ? static_cast<int>(r.below(static_cast<std::uint64_t>(n_edges))) : -1;
    dev.link = {uni(5e6, 5e7), uni(2e-3, 2e-2)};
    p.devices.push_back(dev);
  }
  return p;
}

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median of `runs` timed calls after `warmups` untimed ones.
double median_seconds(const std::function<void()>& f, int warmups, int runs) {
  for (int i = 0; i < warmups; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) t.push_back(seconds_of(f));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double time_plan_best(const split::split_problem& p) {
  return median_seconds([&] { split::plan_best(p); }, 3, 20);
}

// The planner's choices too: micro-batches 1, 2, 4 or 8 of a batch of 64, four cut codecs with
// host-like encoding + decoding costs per value, 64 channels at every cut.
void add_choices(split::split_problem& p) {
  p.batch = 64;
  p.micro_batch_options = {1, 2, 4, 8};
  p.codecs = {
      {core::codec::f32, 0.0}, {core::codec::f16, 0.5e-9}, {core::codec::int8, 1.5e-9}, {core::codec::topk, 6e-9}};
  p.cut_channels.assign(p.cut_bytes.size(), 64.0);
}

// "M=4: 12, M=8: 40" and "f16/int8: 30, ..." over a plan's devices.
void print_choices(const split::split_plan& plan) {
  std::map<int, int> ms;
  std::map<std::string, int> codecs;
  for (const auto& c : plan.choices) {
    ++ms[c.n_micro_batches];
    for (const auto& h : c.hops)
      ++codecs[std::string(core::codec_name(h.up)) + "/" + std::string(core::codec_name(h.down))];
  }
  std::printf("  chosen micro-batches:");
  for (const auto& [m, k] : ms) std::printf(" M=%d: %d", m, k);
  std::printf("; hop codecs (up/down):");
  for (const auto& [c, k] : codecs) std::printf(" %s: %d", c.c_str(), k);
  std::printf("\n");
}

}  // namespace

int main() {
  const auto big = random_problem(1, 100, 4, 64, false);
  const double t_big = time_plan_best(big);
  const auto plan = split::plan_best(big);
  std::printf("plan_best 100 blocks, D E S (4 edges), 64 devices: %.3f ms (target 10 ms), predicted step %.1f ms\n",
              t_big * 1e3, plan.cost.step_seconds * 1e3);

  auto choices = random_problem(1, 100, 4, 64, false);
  add_choices(choices);
  const double t_choices = time_plan_best(choices);
  const auto chosen = split::plan_best(choices);
  std::printf(
      "plan_best 100 blocks, D E S (4 edges), 64 devices, M in {1,2,4,8}, 4 codecs: %.3f ms (target 10 ms), "
      "predicted step %.1f ms\n",
      t_choices * 1e3, chosen.cost.step_seconds * 1e3);
  print_choices(chosen);

  const auto two = random_problem(2, 100, 0, 64, false);
  std::printf("plan_best 100 blocks, D S, 64 devices: %.3f ms\n", time_plan_best(two) * 1e3);

  const auto u3 = random_problem(3, 50, 4, 64, true);
  std::printf("plan_best 50 blocks, D E S E D (4 edges), 64 devices: %.3f ms\n", time_plan_best(u3) * 1e3);

  const auto u2 = random_problem(4, 50, 0, 64, true);
  std::printf("plan_best 50 blocks, D S D, 64 devices: %.3f ms\n", time_plan_best(u2) * 1e3);

  for (const bool u : {false, true}) {
    const int n = u ? 12 : 20;
    const auto small = random_problem(5, n, 2, 8, u);
    const double t_all = median_seconds([&] { split::plan_exhaustive(small); }, 1, 5);
    const double t_best = median_seconds([&] { split::plan_best(small); }, 3, 20);
    const auto best = split::plan_best(small), all = split::plan_exhaustive(small);
    const bool same = best.routes == all.routes && best.choices == all.choices;
    std::printf("%d blocks, %s, 8 devices: plan_exhaustive %.3f ms, plan_best %.3f ms, ratio %.0fx, same routes: %s\n",
                n, u ? "D E S E D" : "D E S", t_all * 1e3, t_best * 1e3, t_all / t_best, same ? "yes" : "NO");
  }
  return 0;
}
