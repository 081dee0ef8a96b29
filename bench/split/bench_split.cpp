// Time per training step of LeNet-5 (batch 64) trained locally and split over 2 and 3 tiers
// (device, [edge,] server as nodes on threads of this process, over TLS on loopback), measured
// side by side in one run. The first round of each split run warms up (primitive JIT, TLS
// session); the second is measured from its start until every replica is in.
// Usage: bench_split [--backend B] [--steps N] [--data D] [--micro-batches M]
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <string>
#include <thread>

#include "cleave/backend/registry.h"
#include "cleave/core/trainer.h"
#include "cleave/device/agent.h"
#include "cleave/edge/edge_node.h"
#include "cleave/server/server_node.h"
#include "cleave/transport/certs.h"

namespace fs = std::filesystem;
using namespace cleave;

namespace {

double local_ms_per_step(const std::string& be, const core::dataset& train, const core::model_spec& m, int steps) {
  auto b = backend::make_backend(be);
  core::train_config c;
  core::trainer t(*b, m, c);
  const std::int64_t per = train.item.numel();
  std::vector<float> x(static_cast<std::size_t>(64 * per));
  std::vector<std::int32_t> y(64);
  const auto order = core::epoch_order(train.size(), 1, 0);
  auto run = [&](int n, int offset) {
    for (int s = 0; s < n; ++s) {
      train.gather(order.data() + ((offset + s) * 64) % (train.size() - 64), 64, x.data(), y.data());
      t.step(x.data(), y.data(), 64);
    }
    b->synchronize();
  };
  run(steps, 0);  // warm-up, as the split runs' first round
  const auto t0 = std::chrono::steady_clock::now();
  run(steps, steps);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
}

double split_ms_per_step(const std::string& be, const std::string& data, const fs::path& certs, bool edge, int steps,
                         int micro_batches) {
  server::server_config sc;
  sc.certs = certs;
  sc.port = 0;
  sc.backend = be;
  sc.data = data;
  sc.rounds = 2;
  sc.local_steps = steps;
  sc.micro_batches = micro_batches;
  sc.adaptive = false;  // the default cuts, as measured
  std::vector<server::round_report> reports;
  sc.on_round = [&](const server::round_report& r) { reports.push_back(r); };
  std::promise<std::uint16_t> port;
  sc.on_listening = [&](std::uint16_t p) { port.set_value(p); };
  server::server_node srv(sc);
  std::thread ts([&] { srv.run(); });
  const std::uint16_t sp = port.get_future().get();
  std::unique_ptr<edge::edge_node> en;
  std::thread te;
  std::uint16_t up = sp;
  if (edge) {
    edge::edge_config ec;
    ec.certs = certs;
    ec.port = 0;
    ec.upstream_port = sp;
    ec.backend = be;
    en = std::make_unique<edge::edge_node>(ec);
    te = std::thread([&] { en->run(); });
    while (en->port() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    up = en->port();
  }
  device::agent_config ac;
  ac.certs = certs;
  ac.name = "device-1";
  ac.id = 1;
  ac.upstream_port = up;
  ac.upstream_name = edge ? "edge-1" : "server";
  ac.backend = be;
  ac.data = data;
  ac.partition = cleave::core::parse_partition("all");
  device::agent a(ac);
  std::thread ta([&] { a.run(); });
  ts.join();
  ta.join();
  if (te.joinable()) te.join();
  if (reports.size() != 2) throw core::error("the split run did not finish its rounds");
  return reports[1].train_seconds * 1000.0 / steps;
}

}  // namespace

int main(int argc, char** argv) {
  std::string be = "onednn", data = "fashion-mnist";
  int steps = 200, micro_batches = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--backend")
      be = v;
    else if (k == "--steps")
      steps = std::stoi(v);
    else if (k == "--data")
      data = v;
    else if (k == "--micro-batches")
      micro_batches = std::stoi(v);
    else {
      std::fprintf(stderr, "bench_split: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    spdlog::set_level(spdlog::level::warn);
    const fs::path certs = fs::temp_directory_path() / ("cleave-bench-split-" + std::to_string(::getpid()));
    transport::init_ca(certs);
    for (auto [name, role] : {std::pair{"server", core::tier::server}, std::pair{"edge-1", core::tier::edge},
                              std::pair{"device-1", core::tier::device}}) {
      transport::issue_options o;
      o.role = role;
      transport::issue_certificate(certs, name, o);
    }
    const auto d = core::load_dataset(data);
    const auto m = core::zoo_model("lenet5", d.train.item, d.train.n_classes);
    const double local = local_ms_per_step(be, d.train, m, steps);
    const double two = split_ms_per_step(be, data, certs, false, steps, micro_batches);
    const double three = split_ms_per_step(be, data, certs, true, steps, micro_batches);
    const double local2 = local_ms_per_step(be, d.train, m, steps);  // again: drift on a shared machine
    const double loc = std::min(local, local2);
    std::printf("LeNet-5, batch 64, backend %s, %d measured steps each (micro-batches %d)\n", be.c_str(), steps,
                micro_batches);
    std::printf("  local                      %7.3f ms/step  (runs: %.3f, %.3f)\n", loc, local, local2);
    std::printf("  split 2-tier (TLS)         %7.3f ms/step  ratio split/local %.2f\n", two, two / loc);
    std::printf("  split 3-tier (TLS)         %7.3f ms/step  ratio split/local %.2f  (target <= 1.15)\n", three,
                three / loc);
    fs::remove_all(certs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_split: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
