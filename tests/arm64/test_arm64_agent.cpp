// The arm64 build of cleave (scripts/cross-arm64.sh) as a device agent under qemu-user: it joins
// an x86-64 server through an x86-64 edge on loopback and trains as an x86-64 agent does.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "../security/nodes.h"
#include "cleave/core/checkpoint.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

// Generous: every step of the agent runs emulated.
constexpr double federation_seconds = 240;

// The ELF machine of a file (0 when it is not a little-endian ELF file); 183 is EM_AARCH64.
int elf_machine(const fs::path& p) {
  constexpr unsigned char elf_magic[4] = {0x7f, 'E', 'L', 'F'};
  std::ifstream f(p, std::ios::binary);
  unsigned char h[20] = {};
  if (!f.read(reinterpret_cast<char*>(h), sizeof h) || std::memcmp(h, elf_magic, 4) != 0 || h[5] != 1) return 0;
  return h[18] | h[19] << 8;
}
constexpr int em_aarch64 = 183;

// `name` on PATH ("" when not there).
std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string d; std::getline(dirs, d, ':');)
    if (!d.empty() && ::access((fs::path(d) / name).c_str(), X_OK) == 0) return (fs::path(d) / name).string();
  return {};
}

// The global model's parameters in a server checkpoint written after `round`: every "p:" tensor
// (the trainer's format), in the order the checkpoint lists them.
std::vector<float> global_params(const fs::path& checkpoint, std::int64_t round) {
  REQUIRE_MESSAGE(fs::exists(checkpoint), "the server wrote no checkpoint " << checkpoint);
  const auto ck = core::load_checkpoint(checkpoint.string());
  CHECK(ck.epoch == round);
  std::vector<float> out;
  for (const auto& t : ck.tensors)
    if (t.name.rfind("p:", 0) == 0) out.insert(out.end(), t.values.begin(), t.values.end());
  REQUIRE_MESSAGE(!out.empty(), "checkpoint " << checkpoint << " holds no parameters");
  return out;
}

struct trained {
  std::vector<float> round1, round2;  // the global model after each round
  std::string route;                  // device 1's route in round 1, as the server logs it
};

// 2 rounds of 4 steps of LeNet-5 (batch 16) on a fixed 3-tier plan: blocks [0,3) on device 1,
// [3,7) on edge-1, the rest on the server; server and edge are this x86-64 build on the
// reference backend, the agent is `agent_command` on onednn. `tag` names the logs and files.
trained train_through_edge(const workspace& w, const std::string& tag, const std::vector<std::string>& agent_command) {
  // After round 2 the server's checkpoint holds round 2, and the one it keeps beside it round 1.
  const fs::path checkpoint = w.dir / (tag + ".ckpt");
  const std::string idle = "120";  // seconds without a frame: emulated nodes answer late
  node server(w, tag + "-server",
              {"--log-level",
               "info",
               "server",
               "--certs",
               w.certs.string(),
               "--listen",
               "127.0.0.1:0",
               "--model",
               "lenet5",
               "--data",
               w.data.string(),
               "--backend",
               "reference",
               "--rounds",
               "2",
               "--local-steps",
               "4",
               "--batch",
               "16",
               "--min-devices",
               "1",
               "--edge-cuts",
               "3,7",
               "--no-adapt",
               "--deadline",
               "600",
               "--idle-timeout",
               idle,
               "--checkpoint",
               checkpoint.string()});
  const auto sp = server.port_after("listening on ");
  node edge(w, tag + "-edge",
            {"--log-level", "info", "edge", "--certs", w.certs.string(), "--name", "edge-1", "--id", "100", "--listen",
             "127.0.0.1:0", "--server", "127.0.0.1:" + std::to_string(sp), "--server-name", "server", "--backend",
             "reference", "--idle-timeout", idle});
  const auto ep = edge.port_after("devices connect to ");
  auto args = agent_argv(w, 1, ep, "onednn:1", "info");
  args.insert(args.end(), {"--upstream-name", "edge-1", "--idle-timeout", idle});
  node agent(w, tag + "-agent", args, agent_command);
  const int code = server.exit_code(federation_seconds);
  REQUIRE_MESSAGE(code == 0, tag << ": the server did not end its 2 rounds within " << federation_seconds
                                 << " s\n--- server\n"
                                 << server.log() << "--- edge\n"
                                 << edge.log() << "--- agent\n"
                                 << agent.log());
  INFO(tag << " agent:\n" << agent.log());
  CHECK(server.logged("round 1/2: 1/1 devices"));
  CHECK(server.logged("round 2/2: 1/1 devices"));
  CHECK(agent.logged("backend onednn"));
  CHECK(agent.exit_code(60) == 0);
  CHECK(edge.exit_code(60) == 0);
  trained t;
  const std::string log = server.log();
  const std::string route_at = "round 1: device 1: ";
  const auto at = log.find(route_at);
  REQUIRE_MESSAGE(at != std::string::npos, log);
  t.route = log.substr(at + route_at.size(), log.find('\n', at) - at - route_at.size());
  t.round1 = global_params(checkpoint.string() + ".1", 1);
  t.round2 = global_params(checkpoint, 2);
  return t;
}

}  // namespace

TEST_CASE("an arm64 agent under qemu trains through an x86-64 edge as an x86-64 agent does (to 1e-4)") {
  const fs::path arm64 = CLEAVE_ARM64_BINARY;
  if (!fs::exists(arm64)) {
    std::printf("skipped: no arm64 build of cleave at %s (scripts/cross-arm64.sh builds it)\n", arm64.c_str());
    std::fflush(stdout);
    std::exit(77);
  }
  REQUIRE_MESSAGE(elf_machine(arm64) == em_aarch64, arm64 << " is not an arm64 (aarch64) executable");
  const std::string qemu = on_path("qemu-aarch64-static");
  REQUIRE_MESSAGE(!qemu.empty(), "qemu-aarch64-static is not on PATH (install qemu-user-static) to run " << arm64);

  workspace w("arm64", 1, 512, 128);
  // On the multiarch arm64 C library its arm64 packages use (not -L /usr/aarch64-linux-gnu: that
  // loader is another glibc build than their libc.so.6; the first pthread_create hangs).
  const fs::path loader = "/lib/ld-linux-aarch64.so.1";
  REQUIRE_MESSAGE(fs::exists(loader), loader << " is missing (install libc6:arm64) to run " << arm64);
  const trained on_arm64 = train_through_edge(w, "arm64", {qemu, arm64.string()});
  const trained on_x86 = train_through_edge(w, "x86-64", {CLEAVE_BINARY});

  CHECK(on_x86.route == "device[0,3) edge[3,7) server[7,12)");
  CHECK(on_arm64.route == on_x86.route);
  // The rounds trained: the model moved from round 1 to round 2.
  CHECK(max_rel_diff(on_x86.round2, on_x86.round1) > 1e-3);
  const double round1 = max_rel_diff(on_arm64.round1, on_x86.round1);
  const double round2 = max_rel_diff(on_arm64.round2, on_x86.round2);
  std::printf(
      "arm64 vs x86-64 agent, route %s, %zu parameters: max relative difference of the global model after round 1 "
      "%.3g (limit 1e-4), after round 2 %.3g\n",
      on_x86.route.c_str(), on_x86.round1.size(), round1, round2);
  std::fflush(stdout);
  CHECK(round1 <= 1e-4);
}
