// A server killed (SIGKILL) after round 3 and started again with the same command resumes from
// its checkpoint at round 4, its devices (directly or behind an edge) reconnect by themselves
// and continue with the right state, and the final global model equals that of a run nobody
// interrupted; an adaptive run resumes with the plan it had moved to, not the configured cuts.
// A server stopped (SIGSTOP) longer than its devices' link timeout carries on when continued.
// Real processes on loopback.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "../security/nodes.h"
#include "cleave/core/checkpoint.h"
#include "cleave/transport/listener.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

std::optional<core::checkpoint> try_load(const fs::path& p) {
  try {
    return core::load_checkpoint(p.string());
  } catch (const core::error&) {
    return std::nullopt;
  }
}

// The largest difference between the two models' parameters and state, relative to the
// largest magnitude of each tensor.
double max_relative_difference(const core::checkpoint& a, const core::checkpoint& b) {
  double worst = 0;
  for (const auto& ea : a.tensors) {
    if (ea.name.rfind("p:", 0) != 0 && ea.name.rfind("s:", 0) != 0) continue;
    const auto* eb = b.find(ea.name);
    REQUIRE_MESSAGE(eb != nullptr, ea.name);
    REQUIRE(eb->values.size() == ea.values.size());
    double scale = 1e-12, diff = 0;
    for (std::size_t i = 0; i < ea.values.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(ea.values[i])));
      diff = std::max(diff, static_cast<double>(std::fabs(ea.values[i] - eb->values[i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

struct federation_shape {
  int devices = 1;
  bool edge = false;
  bool sequential = false;  // --mode sequential: one server replica the devices take turns on
};

// Runs 6 rounds of a federation whose server writes `ckpt`; with `kill_after`, the server is
// killed once that round's checkpoint is there and started again with the same command. Returns
// the round the server was killed after (0: not killed).
std::int64_t run(const workspace& w, const federation_shape& f, const fs::path& ckpt, std::int64_t kill_after,
                 std::string& server_log) {
  const std::uint16_t port = transport::free_loopback_port();  // where the restarted server listens too
  std::vector<std::string> options{"--checkpoint", ckpt.string(), "--momentum", "0.9",
                                   "--lr",         "0.0005",      "--deadline", "60"};
  if (f.sequential) options.insert(options.end(), {"--mode", "sequential"});
  auto args = server_args(w, 6, 8, f.devices, options);
  *(std::find(args.begin(), args.end(), "--listen") + 1) = "127.0.0.1:" + std::to_string(port);
  auto server = std::make_unique<node>(w, "server-" + ckpt.stem().string(), args);
  std::unique_ptr<node> edge;
  std::uint16_t device_port = port;
  if (f.edge) {
    edge =
        std::make_unique<node>(w, "edge-" + ckpt.stem().string(),
                               std::vector<std::string>{"--log-level", "info", "edge", "--certs", w.certs.string(),
                                                        "--name", "edge-1", "--listen", "127.0.0.1:0", "--server",
                                                        "127.0.0.1:" + std::to_string(port), "--backend", "reference"});
    device_port = edge->port_after("devices connect to ");
  }
  std::vector<std::unique_ptr<node>> agents;
  for (int i = 1; i <= f.devices; ++i) {
    std::vector<std::string> extra;
    if (f.edge) extra = {"--upstream-name", "edge-1"};
    agents.push_back(std::make_unique<node>(w, "device-" + std::to_string(i) + "-" + ckpt.stem().string(),
                                            agent_args(w, i, device_port, extra)));
  }
  std::int64_t killed_after = 0;
  if (kill_after > 0) {
    const auto t0 = steady_clock::now();
    for (;;) {
      if (const auto ck = try_load(ckpt); ck && ck->epoch >= kill_after) {
        ::kill(server->pid(), SIGKILL);
        killed_after = ck->epoch;
        break;
      }
      REQUIRE_MESSAGE(seconds_since(t0) < 120, server->log());
      REQUIRE_MESSAGE(server->alive(), server->log());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    CHECK(server->exit_code(10) == -1);  // killed
    server_log += server->log();
    server = std::make_unique<node>(w, "server-again-" + ckpt.stem().string(), args);  // the same command
  }
  const int code = server->exit_code(180);
  server_log += server->log();
  REQUIRE_MESSAGE(code == 0, server_log);
  for (auto& a : agents) CHECK_MESSAGE(a->exit_code(60) == 0, a->log());
  if (edge) CHECK_MESSAGE(edge->exit_code(60) == 0, edge->log());
  return killed_after;
}

void check_resume_is_exact(const federation_shape& f, const std::string& name) {
  workspace w(name, f.devices, 512, 128);
  std::string log_a, log_b;
  run(w, f, w.dir / "uninterrupted.ckpt", 0, log_a);
  const fs::path crashed = w.dir / "crashed.ckpt";
  const std::int64_t killed_after = run(w, f, crashed, 3, log_b);
  INFO("server logs: " << log_b);
  REQUIRE(killed_after >= 3);
  CHECK(log_b.find("server: resuming from " + crashed.string() + " after round " + std::to_string(killed_after) +
                   " of 6") != std::string::npos);
  const auto a = core::load_checkpoint((w.dir / "uninterrupted.ckpt").string());
  const auto b = core::load_checkpoint(crashed.string());
  CHECK(a.epoch == 6);
  CHECK(b.epoch == 6);
  // The rounds after the restart continued from the checkpoint: the kept ones are rounds 5 and 4.
  CHECK(core::load_checkpoint(crashed.string() + ".1").epoch == 5);
  CHECK(core::load_checkpoint(crashed.string() + ".2").epoch == 4);
  const double diff = max_relative_difference(a, b);
  MESSAGE(name << ": killed after round " << killed_after << "; final global model, max relative difference " << diff);
  CHECK(diff <= 1e-5);
}

}  // namespace

TEST_CASE("a server killed after round 3 resumes exactly: one device, fixed plan") {
  check_resume_is_exact({1, false}, "resume-1");
}

TEST_CASE("a server killed after round 3 resumes exactly: two devices behind an edge, SplitFed") {
  check_resume_is_exact({2, true}, "resume-edge");
}

TEST_CASE("a server killed after round 3 resumes exactly: two devices behind an edge taking turns (sequential)") {
  check_resume_is_exact({2, true, true}, "resume-seq");
}

TEST_CASE("a server killed after round 3 of an adaptive run resumes with the plan it had moved to") {
  workspace w("resume-adaptive", 1, 256, 64);
  const fs::path ckpt = w.dir / "adaptive.ckpt";
  const std::string configured = "device[0,5) server[5,6)";
  // Rounds enough that the kill lands before the end, however late this process sees round 3's
  // checkpoint on a busy machine.
  const int rounds = 8;
  auto args = server_args(w, rounds, 6, 1, {"--checkpoint", ckpt.string(), "--cuts", "5", "--deadline", "60"});
  args.erase(std::find(args.begin(), args.end(), "--no-adapt"));  // adaptive
  const std::uint16_t port = transport::free_loopback_port();
  *(std::find(args.begin(), args.end(), "--listen") + 1) = "127.0.0.1:" + std::to_string(port);
  auto server = std::make_unique<node>(w, "server-adaptive", args);
  // A board far slower than the server: the splitter moves its blocks up in round 1, whatever the
  // load of this machine.
  node agent(w, "device-adaptive", agent_args(w, 1, port, {"--slowdown", "20", "--profile-every", "2"}));
  std::optional<core::checkpoint> at_kill;
  for (const auto t0 = steady_clock::now();;) {
    if (auto ck = try_load(ckpt); ck && ck->epoch >= 3) {
      ::kill(server->pid(), SIGKILL);
      at_kill = std::move(ck);
      break;
    }
    REQUIRE_MESSAGE(seconds_since(t0) < 60, server->log());
    REQUIRE_MESSAGE(server->alive(), server->log());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CHECK(server->exit_code(10) == -1);  // killed
  const std::string first_log = server->log();
  INFO("server before the kill: " << first_log);
  REQUIRE_MESSAGE(at_kill->epoch < rounds, "the run ended before the kill");
  // What the checkpoint holds of the splitter: the plan moved away from the configured cuts, and
  // the book with the profiles of both nodes.
  const std::string stored = at_kill->meta.at("route:1");
  const std::string epoch = at_kill->meta.at("route:1:epoch");
  REQUIRE(stored != configured);
  CHECK(std::stoul(epoch) > 1);
  CHECK(at_kill->meta.count("book:profile:server:0:blocks") == 1);
  CHECK(at_kill->meta.count("book:profile:device:1:blocks") == 1);
  CHECK(first_log.find("server: re-split device 1") != std::string::npos);

  server = std::make_unique<node>(w, "server-adaptive-again", args);  // the same command
  const int code = server->exit_code(60);
  const std::string log = server->log();
  INFO("server after the restart: " << log);
  REQUIRE(code == 0);
  CHECK_MESSAGE(agent.exit_code(30) == 0, agent.log());
  CHECK(log.find("server: resuming from " + ckpt.string() + " after round " + std::to_string(at_kill->epoch) + " of " +
                 std::to_string(rounds)) != std::string::npos);
  CHECK(log.find("the splitter's book of 2 nodes") != std::string::npos);
  CHECK(log.find("routes: device 1 " + stored + " (plan " + epoch + ")") != std::string::npos);
  // The device came back under the stored route and plan, and never went through the configured cuts.
  CHECK(log.find(": " + stored + ", its route at the checkpoint (plan " + epoch + ")") != std::string::npos);
  CHECK(log.find(configured) == std::string::npos);
  CHECK(log.find("round " + std::to_string(at_kill->epoch + 1) + ": device 1: ") != std::string::npos);
  CHECK(log.find("its optimizer state from the checkpoint is not restored") == std::string::npos);
  const std::string agent_log = agent.log();
  const std::string plan_line = "device 1: plan " + epoch + ": " + stored;
  CHECK_MESSAGE(agent_log.find(plan_line) != std::string::npos, agent_log);
  // The run finished from there with a finite model.
  const auto last = core::load_checkpoint(ckpt.string());
  CHECK(last.epoch == rounds);
  std::size_t n_values = 0;
  for (const auto& e : last.tensors) {
    if (e.name.rfind("p:", 0) != 0 && e.name.rfind("s:", 0) != 0) continue;
    for (float v : e.values) REQUIRE_MESSAGE(std::isfinite(v), e.name);
    n_values += e.values.size();
  }
  CHECK(n_values > 0);
}

TEST_CASE("a server paused longer than its devices' link timeout carries on when resumed, and so do its devices") {
  workspace w("server-paused", 2, 512, 128);
  auto args = server_args(w, 6, 40, 2, {"--deadline", "60"});
  const std::uint16_t port = transport::free_loopback_port();
  *(std::find(args.begin(), args.end(), "--listen") + 1) = "127.0.0.1:" + std::to_string(port);
  node server(w, "server-paused", args);
  std::vector<std::unique_ptr<node>> agents;
  for (int i = 1; i <= 2; ++i)
    agents.push_back(std::make_unique<node>(w, "device-" + std::to_string(i) + "-paused",
                                            agent_args(w, i, port, {"--idle-timeout", "1", "--slowdown", "5"})));
  REQUIRE_MESSAGE(server.wait_for("round 1/6:", 60), server.log());
  // A machine suspended, or a process stopped: the devices' links time out meanwhile.
  ::kill(server.pid(), SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  ::kill(server.pid(), SIGCONT);
  const int code = server.exit_code(120);
  const std::string log = server.log();
  INFO("server: " << log);
  REQUIRE(code == 0);
  for (auto& a : agents) CHECK_MESSAGE(a->exit_code(30) == 0, a->log());
  CHECK(log.find("training finished after 6 rounds") != std::string::npos);
  CHECK(log.find("round 6/6: 2/2 devices") != std::string::npos);
}
