// Test federations on loopback: certificates in a temporary directory, a small IDX data set,
// and server, edge and device nodes on threads of this process (or device agents as processes).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cleave/backend/registry.h"
#include "cleave/core/dataset.h"
#include "cleave/core/random.h"
#include "cleave/device/agent.h"
#include "cleave/edge/edge_node.h"
#include "cleave/server/server_node.h"
#include "cleave/transport/certs.h"

namespace cleave::testing {

namespace fs = std::filesystem;

inline std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// A 10-class 28x28 data set whose classes differ in mean brightness of image bands, so a
// model can learn it; n_train / n_test images.
inline fs::path make_idx_data(const fs::path& dir, int n_train, int n_test) {
  fs::create_directories(dir);
  core::rng r(42);
  for (auto [prefix, n] : {std::pair{"train", n_train}, std::pair{"t10k", n_test}}) {
    std::string img = be32(0x803) + be32(static_cast<std::uint32_t>(n)) + be32(28) + be32(28);
    std::string lab = be32(0x801) + be32(static_cast<std::uint32_t>(n));
    for (int i = 0; i < n; ++i) {
      const int c = static_cast<int>(r.below(10));
      for (int p = 0; p < 784; ++p) {
        const int band = (p / 28) / 3;  // 0..9
        const float v = (band == c ? 180.0f : 40.0f) + r.uniform(-40.0f, 40.0f);
        img.push_back(static_cast<char>(static_cast<unsigned char>(std::clamp(v, 0.0f, 255.0f))));
      }
      lab.push_back(static_cast<char>(c));
    }
    std::ofstream(dir / (std::string(prefix) + "-images-idx3-ubyte"), std::ios::binary) << img;
    std::ofstream(dir / (std::string(prefix) + "-labels-idx1-ubyte"), std::ios::binary) << lab;
  }
  return dir;
}

// The backend the runtime tests use: onednn where built, else the reference.
inline std::string test_backend() {
  for (const auto& b : backend::list_backends())
    if (b.name == "onednn" && b.available) return "onednn:1";
  return "reference";
}

struct workspace {
  fs::path dir, certs, data;
  explicit workspace(const std::string& name, int n_devices, int n_train = 2048, int n_test = 512) {
    dir = fs::temp_directory_path() / ("cleave-rt-" + std::to_string(::getpid()) + "-" + name);
    fs::remove_all(dir);
    certs = dir / "certs";
    transport::init_ca(certs);
    transport::issue_options so;
    so.role = core::tier::server;
    transport::issue_certificate(certs, "server", so);
    transport::issue_options eo;
    eo.role = core::tier::edge;
    transport::issue_certificate(certs, "edge-1", eo);
    for (int i = 1; i <= n_devices + 1; ++i) {
      transport::issue_options d;
      d.role = core::tier::device;
      transport::issue_certificate(certs, "device-" + std::to_string(i), d);
    }
    data = make_idx_data(dir / "data", n_train, n_test);
  }
  ~workspace() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

// Runs a callable on a thread and joins it on destruction.
class runner {
 public:
  template <class F>
  explicit runner(F f)
      : t_([f = std::move(f), this]() mutable {
          try {
            f();
          } catch (const std::exception& e) {
            std::lock_guard lock(mu_);
            error_ = e.what();
          }
        }) {}
  ~runner() { join(); }
  void join() {
    if (t_.joinable()) t_.join();
  }
  std::string error() {
    std::lock_guard lock(mu_);
    return error_;
  }

 private:
  std::mutex mu_;
  std::string error_;
  std::thread t_;
};

// Tells when round `n` first starts (a round nobody finished starts again).
struct round_started {
  explicit round_started(std::uint64_t n) : n_(n) {}
  std::function<void(std::uint64_t, int)> hook() {
    return [this](std::uint64_t r, int) {
      if (r == n_ && !seen_.exchange(true)) p_.set_value();
    };
  }
  bool wait(double seconds) {
    return p_.get_future().wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready;
  }

 private:
  std::uint64_t n_;
  std::atomic<bool> seen_{false};
  std::promise<void> p_;
};

inline server::server_config server_cfg(const workspace& w, const std::string& backend) {
  server::server_config c;
  c.certs = w.certs;
  c.name = "server";
  c.port = 0;
  c.backend = backend;
  c.model = "lenet5";
  c.data = w.data.string();
  c.join_timeout_s = 60;
  c.round_deadline_s = 60;
  c.adaptive = false;  // plans move only where a test asks for it
  return c;
}

// Records the server's round reports (on its thread: read them after it ends) and tells its port.
inline void record(server::server_config& sc, std::vector<server::round_report>& reports,
                   std::promise<std::uint16_t>& port) {
  sc.on_round = [&reports](const server::round_report& r) { reports.push_back(r); };
  sc.on_listening = [&port](std::uint16_t p) { port.set_value(p); };
}

inline device::agent_config agent_cfg(const workspace& w, std::uint32_t id, std::uint16_t port,
                                      const std::string& backend, const std::string& upstream) {
  device::agent_config a;
  a.certs = w.certs;
  a.name = "device-" + std::to_string(id);
  a.id = id;
  a.upstream_port = port;
  a.upstream_name = upstream;
  a.backend = backend;
  a.data = w.data.string();
  a.partition = "all";
  return a;
}

// A process of the cleave binary with these arguments (its output to `log` when given).
inline pid_t spawn_cleave(const std::vector<std::string>& args, const fs::path& log = {}) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!log.empty()) {
      std::FILE* f = std::freopen(log.c_str(), "w", stderr);
      if (f) ::dup2(::fileno(f), STDOUT_FILENO);
    }
    std::vector<char*> argv{const_cast<char*>(CLEAVE_BINARY)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(CLEAVE_BINARY, argv.data());
    ::_exit(127);
  }
  return pid;
}

// A device agent as a process of the cleave binary; `extra` arguments go last.
inline pid_t spawn_agent(const workspace& w, int id, std::uint16_t port, const std::string& be, double slowdown,
                         const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"--log-level",
                                   "warn",
                                   "agent",
                                   "--certs",
                                   w.certs.string(),
                                   "--id",
                                   std::to_string(id),
                                   "--connect",
                                   "127.0.0.1:" + std::to_string(port),
                                   "--data",
                                   w.data.string(),
                                   "--partition",
                                   "all",
                                   "--backend",
                                   be,
                                   "--slowdown",
                                   std::to_string(slowdown)};
  args.insert(args.end(), extra.begin(), extra.end());
  return spawn_cleave(args);
}

// Waits up to `seconds` for a child to exit; kills it if it does not (an agent that never got
// in before the server finished keeps trying to reconnect). True when it exited by itself.
inline bool exited_within(pid_t pid, double seconds, int& status) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

}  // namespace cleave::testing
