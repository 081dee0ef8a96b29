// Peak memory of a device agent: LeNet-5 on a 1/64 shard of Fashion-MNIST, oneDNN by default.
// The agent runs in this process, the server in a forked child (its memory is its own); the
// figure is this process's VmHWM. Where the resident memory goes is read from /proc/self/smaps
// (by mapping) and from malloc (bytes in use), at start, once the plan and the first global
// weights are in, and after every round.
//
//   bench_agent_memory [--data fashion-mnist|DIR] [--shards 64] [--backend onednn] [--rounds 2]
//                      [--steps 20] [--batch 64]
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cleave/core/dataset.h"
#include "cleave/core/model.h"
#include "cleave/core/partition.h"
#include "cleave/device/agent.h"
#include "cleave/server/server_node.h"
#include "cleave/transport/certs.h"

using namespace cleave;
namespace fs = std::filesystem;

namespace {

struct options {
  std::string data = "fashion-mnist";
  std::string backend = "onednn";
  int shards = 64, rounds = 2, steps = 20, batch = 64;
};

double mib(double bytes) {
  return bytes / (1024.0 * 1024.0);
}

// A line "Key:   1234 kB" of /proc/self/status, in bytes.
double status_bytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) * 1024.0;
  return 0;
}

// Resident bytes by kind of mapping: the executable, oneDNN, OpenSSL, other libraries, anonymous
// executable mappings (JIT code), the rest of anonymous memory (heap, arenas, thread stacks).
std::map<std::string, double> resident_by_mapping() {
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  std::map<std::string, double> out;
  std::ifstream f("/proc/self/smaps");
  std::string kind;
  for (std::string line; std::getline(f, line);) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') < 17) {
      std::istringstream s(line);
      std::string range, perms, offset, dev, inode, path;
      s >> range >> perms >> offset >> dev >> inode;
      std::getline(s >> std::ws, path);
      if (path == exe)
        kind = "executable";
      else if (path.find("libdnnl") != std::string::npos)
        kind = "oneDNN library";
      else if (path.find("libssl") != std::string::npos || path.find("libcrypto") != std::string::npos)
        kind = "OpenSSL libraries";
      else if (path.find(".so") != std::string::npos)
        kind = "other libraries";
      else if (path.empty() && perms.find('x') != std::string::npos)
        kind = "anonymous executable (JIT code)";
      else if (path.empty() || path == "[heap]" || path == "[stack]")
        kind = "anonymous (heap, arenas, stacks)";
      else
        kind = "other files";
    } else if (line.rfind("Rss:", 0) == 0) {
      out[kind] += std::stod(line.substr(4)) * 1024.0;
    }
  }
  return out;
}

void report(const char* when) {
  const auto m = mallinfo2();
  std::printf("\n-- %s: VmRSS %.1f MiB, VmHWM %.1f MiB; malloc: %.1f MiB in use, %.1f MiB held\n", when,
              mib(status_bytes("VmRSS")), mib(status_bytes("VmHWM")), mib(static_cast<double>(m.uordblks + m.hblkhd)),
              mib(static_cast<double>(m.arena + m.hblkhd)));
  for (const auto& [k, v] : resident_by_mapping()) std::printf("   %-34s %7.1f MiB\n", k.c_str(), mib(v));
  std::fflush(stdout);
}

// Runs `f` in a child process; false when it failed.
template <class F>
bool in_child(F f) {
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      f();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_agent_memory: %s\n", e.what());
      ::_exit(1);
    }
    ::_exit(0);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--data")
      o.data = v;
    else if (k == "--backend")
      o.backend = v;
    else if (k == "--shards")
      o.shards = std::stoi(v);
    else if (k == "--rounds")
      o.rounds = std::stoi(v);
    else if (k == "--steps")
      o.steps = std::stoi(v);
    else if (k == "--batch")
      o.batch = std::stoi(v);
    else {
      std::fprintf(stderr, "bench_agent_memory: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  report("start (the binary and its libraries mapped)");
  const fs::path dir = fs::temp_directory_path() / ("cleave-bench-memory-" + std::to_string(::getpid()));
  const fs::path certs = dir / "certs";
  // What this process would otherwise touch first (key generation, the data set's labels) is
  // done in children.
  int shard_pipe[2];
  if (::pipe(shard_pipe) != 0) return 1;
  const bool prepared = in_child([&] {
    transport::init_ca(certs);
    transport::issue_options so;
    so.role = core::tier::server;
    transport::issue_certificate(certs, "server", so);
    transport::issue_certificate(certs, "device-1", transport::issue_options{});
    core::load_options lo;
    lo.test = false;
    lo.pick_train = [&](const std::vector<std::int32_t>& labels, int n_classes) {
      return core::pick_shard("iid", labels, n_classes, o.shards, 0, 1);
    };
    const auto shard = core::load_dataset(o.data, lo).train;
    const std::int64_t n = shard.size();
    if (::write(shard_pipe[1], &n, sizeof n) != sizeof n) throw core::error("pipe");
  });
  std::int64_t n_shard = 0;
  if (!prepared || ::read(shard_pipe[0], &n_shard, sizeof n_shard) != sizeof n_shard) return 1;

  int port_pipe[2];
  if (::pipe(port_pipe) != 0) return 1;
  std::fflush(stdout);
  const pid_t server = ::fork();
  if (server == 0) {
    ::close(port_pipe[0]);
    server::server_config sc;
    sc.certs = certs;
    sc.port = 0;
    sc.backend = o.backend;
    sc.model = "lenet5";
    sc.data = o.data;
    sc.rounds = o.rounds;
    sc.local_steps = o.steps;
    sc.batch = o.batch;
    sc.on_listening = [&](std::uint16_t p) {
      if (::write(port_pipe[1], &p, sizeof p) != sizeof p) std::_Exit(1);
    };
    try {
      server::server_node(sc).run();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_agent_memory: server: %s\n", e.what());
      std::_Exit(1);
    }
    std::_Exit(0);
  }
  ::close(port_pipe[1]);
  std::uint16_t port = 0;
  if (::read(port_pipe[0], &port, sizeof port) != sizeof port) return 1;

  device::agent_config a;
  a.certs = certs;
  a.name = "device-1";
  a.id = 1;
  a.upstream_port = port;
  a.upstream_name = "server";
  a.backend = o.backend;
  a.data = o.data;
  a.n_shards = o.shards;
  a.shard = 0;
  a.on_weights = [](std::uint64_t round) {
    if (round == 0) report("plan in force, blocks profiled, initial global weights installed");
  };
  a.on_round = [](std::uint64_t round, double) { report(("round " + std::to_string(round) + " trained").c_str()); };
  device::agent(a).run();
  int st = 0;
  ::waitpid(server, &st, 0);
  report("end");

  const auto m = core::zoo_model("lenet5", core::shape{1, 28, 28}, 10);
  std::printf("\nagent peak (VmHWM): %.1f MiB for LeNet-5, shard 1/%d (%lld samples) of %s, backend %s\n",
              mib(status_bytes("VmHWM")), o.shards, static_cast<long long>(n_shard), o.data.c_str(), o.backend.c_str());
  std::printf(
      "of which known sizes: the shard %.2f MiB (u8 pixels and labels), the model %.2f MiB "
      "(%lld parameters: values, gradients, SGD momentum)\n",
      mib(static_cast<double>(n_shard) * (784 + 4)), mib(static_cast<double>(m.n_params()) * 4 * 3),
      static_cast<long long>(m.n_params()));
  std::error_code ec;
  fs::remove_all(dir, ec);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
