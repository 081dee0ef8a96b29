// Test federations on loopback: certificates in a temporary directory, a small IDX data set,
// and server, edge and device nodes on threads of this process (or device agents as processes).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>

#include "cleave/backend/registry.h"
#include "cleave/core/dataset.h"
#include "cleave/core/random.h"
#include "cleave/device/agent.h"
#include "cleave/edge/edge_node.h"
#include "cleave/server/server_node.h"
#include "cleave/transport/certs.h"
#include "cleave/transport/connect.h"
#include "cleave/transport/message.h"

namespace cleave::testing {

// Every log line of the nodes of this process while it lives.
class log_capture {
 public:
  log_capture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~log_capture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  // The lines at level `at_least` or above holding every one of `parts`.
  int count(const std::vector<std::string>& parts, spdlog::level::level_enum at_least = spdlog::level::warn) const {
    int n = 0;
    for (const auto& m : sink_->last_raw()) {
      if (m.level < at_least) continue;
      const std::string text(m.payload.begin(), m.payload.end());
      n += std::all_of(parts.begin(), parts.end(), [&](const auto& p) { return text.find(p) != std::string::npos; });
    }
    return n;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

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

// Worst |a - b| / max(1e-3, |b|) over the elements: how far one run's parameters are from another's.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(
        worst, std::fabs(static_cast<double>(a[i]) - b[i]) / std::max(1e-3, std::fabs(static_cast<double>(b[i]))));
  return worst;
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

// The frames a node sends, kept as they went: `recorder()` is its on_send (thread-safe).
class sent_frames {
 public:
  std::function<void(std::span<const std::byte>)> recorder() {
    return [this](std::span<const std::byte> f) {
      std::lock_guard lock(mu_);
      frames_.emplace_back(f.begin(), f.end());
    };
  }
  // Read once the node has stopped.
  const std::vector<std::vector<std::byte>>& all() const { return frames_; }

 private:
  std::mutex mu_;
  std::vector<std::vector<std::byte>> frames_;
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
  a.partition = cleave::core::parse_partition("all");
  return a;
}

// An edge node "edge-1" on a thread of this process, below the server on `server_port`; stop()
// it (and let the runner join) when done.
struct test_edge {
  std::unique_ptr<edge::edge_node> node;
  std::unique_ptr<runner> thread;
  std::uint16_t port = 0;  // where its devices connect
};
inline test_edge start_edge(const workspace& w, const std::string& backend, std::uint16_t server_port,
                            const std::function<void(edge::edge_config&)>& customise = {}) {
  edge::edge_config ec;
  ec.certs = w.certs;
  ec.name = "edge-1";
  ec.port = 0;
  ec.upstream_port = server_port;
  ec.backend = backend;
  if (customise) customise(ec);
  test_edge e;
  e.node = std::make_unique<edge::edge_node>(ec);
  e.thread = std::make_unique<runner>([n = e.node.get()] { n->run(); });
  for (int i = 0; i < 1000 && e.node->port() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  e.port = e.node->port();
  return e;
}

// A raw device connection to the node on loopback port `port` that has sent its Hello claiming
// device `id` (a failed connect is the result's error).
inline asio::awaitable<transport::result<transport::channel>> hello_as(const transport::tls_context& tls,
                                                                       std::uint16_t port, std::uint32_t id) {
  auto ch = co_await transport::connect(tls, "127.0.0.1", port);
  if (!ch) co_return ch;
  protocol::hello_info h;
  h.role = core::tier::device;
  h.node_id = id;
  co_await ch->send(protocol::make_hello(h));
  co_return ch;
}

// One round of `sc` with an honest device 1 (an agent) and two rogue devices 2 and 3 played by
// `rogue` on their raw channels after their Hello (what each returns is kept).
struct rogue_run {
  std::string rogue2, rogue3;
  std::vector<server::round_report> reports;
  std::string server_error;
  std::vector<float> params;  // the global model at the end
};
inline rogue_run run_with_rogues(
    const workspace& w, const std::string& be, server::server_config sc,
    const std::function<asio::awaitable<std::string>(transport::channel& ch, std::uint32_t id)>& rogue) {
  rogue_run out;
  sc.rounds = 1;  // (a second round would wait for three devices again)
  sc.min_devices = 3;
  std::promise<std::uint16_t> port;
  record(sc, out.reports, port);
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  const auto sp = port.get_future().get();
  device::agent good(agent_cfg(w, 1, sp, be, "server"));
  runner rg([&] { good.run(); });
  asio::io_context io;
  auto play = [&](std::uint32_t id) -> asio::awaitable<std::string> {
    const transport::tls_context tls(transport::tls_files_in(w.certs, "device-" + std::to_string(id)));
    auto ch = co_await hello_as(tls, sp, id);
    if (!ch) co_return "connect failed: " + ch.error().reason();
    co_return co_await rogue(*ch, id);
  };
  auto f2 = asio::co_spawn(io, play(2), asio::use_future);
  auto f3 = asio::co_spawn(io, play(3), asio::use_future);
  std::thread io_thread([&] { io.run(); });
  out.rogue2 = f2.get();
  out.rogue3 = f3.get();
  io_thread.join();
  rs.join();
  rg.join();
  out.server_error = rs.error();
  out.params = srv.global_params();
  return out;
}

// The arguments of `cleave agent` for device `id` of the workspace, connecting to `port`.
inline std::vector<std::string> agent_argv(const workspace& w, int id, std::uint16_t port, const std::string& backend,
                                           const std::string& log_level) {
  return {"--log-level",
          log_level,
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
          backend};
}

// A process of `command` (a program and its first arguments) followed by `args` (its output
// to `log` when given).
inline pid_t spawn_program(const std::vector<std::string>& command, const std::vector<std::string>& args,
                           const fs::path& log = {}) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!log.empty()) {
      std::FILE* f = std::freopen(log.c_str(), "w", stderr);
      if (f) ::dup2(::fileno(f), STDOUT_FILENO);
    }
    std::vector<char*> argv;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// A process of the cleave binary with these arguments (its output to `log` when given).
inline pid_t spawn_cleave(const std::vector<std::string>& args, const fs::path& log = {}) {
  return spawn_program({CLEAVE_BINARY}, args, log);
}

// A device agent as a process of the cleave binary; `extra` arguments go last.
inline pid_t spawn_agent(const workspace& w, int id, std::uint16_t port, const std::string& be, double slowdown,
                         const std::vector<std::string>& extra = {}) {
  auto args = agent_argv(w, id, port, be, "warn");
  args.insert(args.end(), {"--slowdown", std::to_string(slowdown)});
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
