// The adaptive splitter's scenario, in one run: LeNet-5 on 3 tiers (server, edge-1, 4 devices
// behind it, nodes on threads of this process over TLS on loopback with emulated links), devices
// 3 and 4 four times slower than devices 1 and 2, device links cut from 1 Gbit/s to 10 Mbit/s at
// a set round. Every node runs on this machine's CPU, so the devices are made boards `--board`
// times slower than it (default 4, as an edge board against a server); 3 and 4 then 4x that.
//   1. adaptive: the splitter re-plans as it measures; reported: the step time after the change
//      (the last rounds), the plan it chose, the cost model's prediction error, the planner's time;
//   2. static plans on the changed scenario, measured one after another in one federation by
//      forcing each in turn: every plan with the same cuts on all devices (the oracle is the best
//      of them), the initial plan (kept after the change) and the adaptive run's final plan.
// Usage: bench_adaptive [--backend B] [--data D] [--rounds N] [--change R] [--steps S] [--board F]
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "cleave/core/model.h"
#include "cleave/device/agent.h"
#include "cleave/edge/edge_node.h"
#include "cleave/server/server_node.h"
#include "cleave/split/plan.h"
#include "cleave/transport/certs.h"

namespace fs = std::filesystem;
using namespace cleave;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int n_devices = 4;

struct scenario {
  std::string backend = "onednn:1", data = "fashion-mnist";
  int rounds = 6, change = 3, steps = 30;
  double board = 4;  // devices 1, 2: this many times slower than the server's CPU; 3, 4: 4x more
  fs::path certs;
  // Links and slowdowns by round: `slow_from` is the round the links drop to 10 Mbit/s.
  std::string schedule(int slow_from) const {
    std::string s = "at 1 link edge-1 server 1Gbit/s 0.5ms";
    for (int d = 1; d <= n_devices; ++d) {
      const std::string dev = "device-" + std::to_string(d);
      if (slow_from > 1) s += "; at 1 link " + dev + " edge-1 1Gbit/s 0.5ms";
      s += "; at " + std::to_string(slow_from) + " link " + dev + " edge-1 10Mbit/s 1ms";
    }
    return s;
  }
};

// When the server saw each step of each device begin.
struct step_clock {
  std::mutex mu;
  std::map<std::uint32_t, std::map<std::uint64_t, clock_type::time_point>> seen;
  void mark(std::uint32_t dev, std::uint64_t step) {
    std::lock_guard lock(mu);
    seen[dev].emplace(step, clock_type::now());
  }
  // Seconds per step of the slowest device over steps [first, end) (all devices train at once).
  double step_seconds(std::uint64_t first, std::uint64_t end) {
    std::lock_guard lock(mu);
    double worst = 0;
    for (auto& [dev, t] : seen) {
      const auto a = t.lower_bound(first), b = t.lower_bound(end);
      if (a == t.end() || b == t.begin()) continue;
      const auto last = std::prev(b);
      if (last->first <= a->first) continue;
      worst = std::max(worst, std::chrono::duration<double>(last->second - a->second).count() /
                                  static_cast<double>(last->first - a->first));
    }
    return worst;
  }
};

struct federation_result {
  std::vector<server::round_report> reports;
};

// One federation: server, edge-1 and four devices (3 and 4 slowed 4x) on threads.
federation_result run(const scenario& sc, server::server_config c, const std::string& schedule) {
  federation_result out;
  c.certs = sc.certs;
  c.port = 0;
  c.backend = sc.backend;
  c.data = sc.data;
  c.min_devices = n_devices;
  c.schedule = cleave::transport::parse_schedule(schedule);
  c.round_deadline_s = 3600;
  c.on_round = [&](const server::round_report& r) {
    out.reports.push_back(r);
    std::fprintf(stderr, "  round %llu: step %.1f ms (predicted %.1f ms), %d re-splits\n",
                 static_cast<unsigned long long>(r.round), r.step_seconds * 1e3, r.predicted_step_seconds * 1e3,
                 r.n_resplits);
  };
  std::promise<std::uint16_t> port;
  c.on_listening = [&](std::uint16_t p) { port.set_value(p); };
  server::server_node srv(c);
  std::thread ts([&] { srv.run(); });
  const std::uint16_t sp = port.get_future().get();
  edge::edge_config ec;
  ec.certs = sc.certs;
  ec.port = 0;
  ec.upstream_port = sp;
  ec.backend = sc.backend;
  ec.schedule = cleave::transport::parse_schedule(schedule);
  ec.profile_every = 5 * n_devices;
  edge::edge_node en(ec);
  std::thread te([&] { en.run(); });
  while (en.port() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::vector<std::unique_ptr<device::agent>> agents;
  std::vector<std::thread> ta;
  for (int d = 1; d <= n_devices; ++d) {
    device::agent_config ac;
    ac.certs = sc.certs;
    ac.name = "device-" + std::to_string(d);
    ac.id = static_cast<std::uint32_t>(d);
    ac.upstream_port = en.port();
    ac.upstream_name = "edge-1";
    ac.backend = sc.backend;
    ac.data = sc.data;
    ac.n_shards = n_devices;
    ac.shard = d - 1;
    ac.slowdown = d > 2 ? 4.0 * sc.board : sc.board;
    ac.schedule = cleave::transport::parse_schedule(schedule);
    ac.profile_every = 5;
    agents.push_back(std::make_unique<device::agent>(ac));
  }
  for (auto& a : agents) ta.emplace_back([p = a.get()] { p->run(); });
  ts.join();
  for (auto& t : ta) t.join();
  te.join();
  if (static_cast<int>(out.reports.size()) != c.rounds) throw core::error("the federation did not finish its rounds");
  return out;
}

// "device[0,3) edge[3,8) server[8,12)" -> route
split::route parse_route(const std::string& s, int n_blocks) {
  std::vector<int> cuts;
  std::size_t pos = 0;
  while ((pos = s.find(',', pos)) != std::string::npos) cuts.push_back(std::stoi(s.substr(++pos)));
  cuts.pop_back();  // the last segment's end is n_blocks
  return split::make_route(false, true, cuts, n_blocks);
}

// Each plan forced in turn for `window` steps in one federation on the changed scenario (slow
// links from round 1): the first step pays for the switch, the others are timed.
std::vector<double> measure(const scenario& sc,
                            const std::vector<std::pair<std::string, std::vector<split::route>>>& plans, int window) {
  std::fprintf(stderr, "static plans: %zu, %d steps each\n", plans.size(), window);
  step_clock clk;
  server::server_config c;
  c.rounds = 1;
  c.local_steps = static_cast<int>(plans.size() + 1) * window;
  c.adaptive = false;
  const auto first = static_cast<std::uint64_t>(c.local_steps);  // round 1 starts here
  c.force_route = [&](std::uint32_t dev, std::uint64_t step, const split::route&) -> std::optional<split::route> {
    clk.mark(dev, step);
    const std::size_t k = std::min<std::size_t>((step - first) / static_cast<std::uint64_t>(window), plans.size() - 1);
    return plans[k].second[static_cast<std::size_t>(dev - 1)];
  };
  run(sc, c, sc.schedule(1));
  std::vector<double> t(plans.size());
  for (std::size_t k = 0; k < plans.size(); ++k)
    t[k] = clk.step_seconds(first + k * window + 1, first + (k + 1) * window + 1);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  scenario sc;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--backend")
      sc.backend = v;
    else if (k == "--data")
      sc.data = v;
    else if (k == "--rounds")
      sc.rounds = std::stoi(v);
    else if (k == "--change")
      sc.change = std::stoi(v);
    else if (k == "--steps")
      sc.steps = std::stoi(v);
    else if (k == "--board")
      sc.board = std::stod(v);
    else {
      std::fprintf(stderr, "bench_adaptive: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (sc.change < 2 || sc.change >= sc.rounds) {
    std::fprintf(stderr, "bench_adaptive: --change must be in [2, rounds)\n");
    return 2;
  }
  try {
    spdlog::set_level(spdlog::level::warn);
    sc.certs = fs::temp_directory_path() / ("cleave-bench-adaptive-" + std::to_string(::getpid()));
    transport::init_ca(sc.certs);
    auto issue = [&](const std::string& name, core::tier role) {
      transport::issue_options o;
      o.role = role;
      transport::issue_certificate(sc.certs, name, o);
    };
    issue("server", core::tier::server);
    issue("edge-1", core::tier::edge);
    for (int d = 1; d <= n_devices; ++d) issue("device-" + std::to_string(d), core::tier::device);
    const int n_blocks = 12;  // lenet5

    // 1. The adaptive run.
    std::fprintf(stderr, "adaptive run: %d rounds x %d steps, links drop at round %d\n", sc.rounds, sc.steps,
                 sc.change);
    server::server_config ac;
    ac.rounds = sc.rounds;
    ac.local_steps = sc.steps;
    ac.adaptive = true;
    step_clock live;  // only watches: the steps are timed the same way as the static plans'
    ac.force_route = [&](std::uint32_t dev, std::uint64_t step, const split::route&) -> std::optional<split::route> {
      live.mark(dev, step);
      return std::nullopt;
    };
    const auto adaptive = run(sc, ac, sc.schedule(sc.change));
    const auto& before = adaptive.reports[static_cast<std::size_t>(sc.change - 2)];  // the plan in force at the change
    const auto& last = adaptive.reports.back();
    // After the change: the rounds after the one it happened in (that one pays for the migration).
    const int from = sc.change + 1;
    double adaptive_step = 0, predicted = 0, planner = 0;
    int n = 0;
    for (int r = from; r <= sc.rounds; ++r) {
      const auto& rep = adaptive.reports[static_cast<std::size_t>(r - 1)];
      // Within the round (a round's start and its averaging are not steps).
      const auto s0 = static_cast<std::uint64_t>(r) * static_cast<std::uint64_t>(sc.steps);
      adaptive_step += live.step_seconds(s0 + 1, s0 + static_cast<std::uint64_t>(sc.steps));
      predicted += rep.predicted_step_seconds;
      ++n;
    }
    for (const auto& rep : adaptive.reports) planner = std::max(planner, rep.planner_seconds);
    adaptive_step /= n;
    predicted /= n;

    // 2. Static plans on the changed scenario (slow links from round 1), forced in turn.
    std::vector<std::pair<std::string, std::vector<split::route>>> plans;
    for (int c1 = 1; c1 <= n_blocks; ++c1)
      for (int c2 = c1; c2 <= n_blocks; ++c2) {
        const auto r = split::make_route(false, true, {c1, c2}, n_blocks);
        plans.emplace_back("uniform " + r.str(), std::vector<split::route>(n_devices, r));
      }
    auto per_device = [&](const server::round_report& rep) {
      std::vector<split::route> routes;
      for (const auto& [id, s] : rep.routes) routes.push_back(parse_route(s, n_blocks));
      return routes;
    };
    const std::size_t initial_index = plans.size();
    plans.emplace_back("initial plan (kept)", per_device(before));
    const std::size_t final_index = plans.size();
    plans.emplace_back("adaptive final plan", per_device(last));
    // Every plan for a few steps, then the fastest few again for longer (one short window each
    // would favour a plan that was lucky once).
    const auto sweep = measure(sc, plans, 4);
    std::vector<std::size_t> order(initial_index);
    for (std::size_t k = 0; k < initial_index; ++k) order[k] = k;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return sweep[a] < sweep[b]; });
    std::vector<std::size_t> finalists(order.begin(), order.begin() + std::min<std::size_t>(5, order.size()));
    finalists.push_back(initial_index);
    finalists.push_back(final_index);
    std::vector<std::pair<std::string, std::vector<split::route>>> again;
    for (auto k : finalists) again.push_back(plans[k]);
    const int long_window = 10;
    const auto remeasured = measure(sc, again, long_window);
    std::vector<double> t = sweep;
    for (std::size_t i = 0; i < finalists.size(); ++i) t[finalists[i]] = remeasured[i];
    std::size_t best = finalists[0];
    for (std::size_t i = 0; i + 2 < finalists.size(); ++i)
      if (t[finalists[i]] < t[best]) best = finalists[i];

    std::printf(
        "Adaptive splitter scenario: LeNet-5, batch 64, 3 tiers, %d devices (1, 2: boards %.0fx slower than the "
        "server; 3, 4: slowed 4x more), device links 1 Gbit/s -> 10 Mbit/s at round %d, backend %s\n",
        n_devices, sc.board, sc.change, sc.backend.c_str());
    std::printf("  adaptive, after the change (rounds %d-%d):  %8.1f ms/step\n", from, sc.rounds, adaptive_step * 1e3);
    std::printf("    its final plan:");
    for (const auto& [id, s] : last.routes) std::printf(" [d%u %s]", id, s.c_str());
    std::printf("\n    cost model: predicted %.1f ms/step, error %+.0f%%\n", predicted * 1e3,
                (predicted / adaptive_step - 1) * 100);
    std::printf("    planner: longest search %.3f ms\n", planner * 1e3);
    std::printf(
        "  static plans measured on the changed scenario (%zu uniform plans, 3 timed steps each; the 5 fastest,\n"
        "  the initial and the adaptive final plan again for %d):\n",
        initial_index, long_window - 1);
    std::printf("    oracle (best static): %-38s %8.1f ms/step\n", plans[best].first.c_str(), t[best] * 1e3);
    std::printf("    initial plan, kept:  ");
    for (const auto& [id, s] : before.routes) std::printf(" [d%u %s]", id, s.c_str());
    std::printf(" %8.1f ms/step\n", t[initial_index] * 1e3);
    std::printf("    adaptive final plan, static:                    %8.1f ms/step\n", t[final_index] * 1e3);
    std::printf("  ratio adaptive / oracle: %.2f (target <= 1.10)\n", adaptive_step / t[best]);
    std::printf("  ratio initial plan / adaptive: %.2f (target >= 2)\n", t[initial_index] / adaptive_step);
    std::printf("  all static plans (ms/step; sweep, then the longer measurement where there is one):\n");
    for (std::size_t k = 0; k < plans.size(); ++k) {
      std::printf("    %-44s %8.1f", plans[k].first.c_str(), sweep[k] * 1e3);
      if (t[k] != sweep[k]) std::printf(" %8.1f", t[k] * 1e3);
      std::printf("\n");
    }
    fs::remove_all(sc.certs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_adaptive: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
