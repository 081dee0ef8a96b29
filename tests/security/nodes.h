// Real `cleave` processes on loopback for the security tests: a node with its log file, waits on
// what it logs, its port, its memory; and the hostile client's pieces (raw TCP, mTLS with a
// chosen certificate).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../runtime/federation.h"
#include "../support/idle_flood.h"
#include "cleave/protocol/protocol.h"
#include "cleave/transport/connect.h"
#include "cleave/transport/tls_context.h"

namespace cleave::testing {

using std::chrono::steady_clock;

inline double seconds_since(steady_clock::time_point t0) {
  return std::chrono::duration<double>(steady_clock::now() - t0).count();
}

inline std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A cleave process whose stdout and stderr go to a log file; killed if still running at the end.
// `command` runs another build of cleave (or this one through a wrapper such as an emulator):
// a program and its first arguments, before `args`.
class node {
 public:
  node(const workspace& w, const std::string& name, const std::vector<std::string>& args,
       const std::vector<std::string>& command = {CLEAVE_BINARY})
      : log_(w.dir / (name + ".log")) {
    pid_ = spawn_program(command, args, log_);
    REQUIRE(pid_ > 0);
  }
  ~node() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status_, 0);
    }
  }
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  pid_t pid() const { return pid_; }
  std::string log() const { return read_file(log_); }
  bool logged(const std::string& text) const { return log().find(text) != std::string::npos; }
  // Waits up to `seconds` for `text` in the log (false: not seen, or the process ended first).
  bool wait_for(const std::string& text, double seconds) const {
    const auto until = steady_clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      if (logged(text)) return true;
      if (steady_clock::now() > until || !alive()) return logged(text);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // The port after "`prefix`HOST:" in the log.
  std::uint16_t port_after(const std::string& prefix, double seconds = 60) const {
    REQUIRE_MESSAGE(wait_for(prefix, seconds), log());
    const std::regex re(prefix + "[0-9.]+:([0-9]+)");
    std::smatch m;
    const std::string text = log();
    REQUIRE_MESSAGE(std::regex_search(text, m, re), text);
    return static_cast<std::uint16_t>(std::stoi(m[1].str()));
  }
  bool alive() const {
    if (exited_) return false;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      exited_ = true;
      status_ = st;
      return false;
    }
    return true;
  }
  // Waits for the exit; -1 when it did not exit in time (then killed) or died of a signal.
  int exit_code(double seconds) {
    if (!exited_) {
      exited_ = true;
      if (!exited_within(pid_, seconds, status_)) return -1;
    }
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
  }
  int signal_number() const { return exited_ && WIFSIGNALED(status_) ? WTERMSIG(status_) : 0; }
  // Resident memory in KiB (from /proc).
  long rss_kib() const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    for (std::string line; std::getline(f, line);)
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return -1;
  }
  int count(const std::string& text) const {
    const std::string s = log();
    int n = 0;
    for (auto at = s.find(text); at != std::string::npos; at = s.find(text, at + 1)) ++n;
    return n;
  }

 private:
  fs::path log_;
  pid_t pid_ = -1;
  mutable bool exited_ = false;
  mutable int status_ = 0;
};

// A small federation's server process: `rounds` rounds of `steps` steps of mlp, waiting for
// `min_devices`; more arguments after, logging at `level`.
inline std::vector<std::string> server_args(const workspace& w, int rounds, int steps, int min_devices,
                                            const std::vector<std::string>& extra = {},
                                            const std::string& level = "info") {
  std::vector<std::string> a = {"--log-level",
                                level,
                                "server",
                                "--certs",
                                w.certs.string(),
                                "--listen",
                                "127.0.0.1:0",
                                "--model",
                                "mlp",
                                "--data",
                                w.data.string(),
                                "--backend",
                                "reference",
                                "--rounds",
                                std::to_string(rounds),
                                "--local-steps",
                                std::to_string(steps),
                                "--min-devices",
                                std::to_string(min_devices),
                                "--no-adapt",
                                "--batch",
                                "16"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

inline std::vector<std::string> agent_args(const workspace& w, int id, std::uint16_t port,
                                           const std::vector<std::string>& extra = {}) {
  auto a = agent_argv(w, id, port, "reference", "info");
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// An io_context on its own thread for the hostile client's coroutines.
class client_thread {
 public:
  client_thread() : work_(io_.get_executor()), t_([this] { io_.run(); }) {}
  ~client_thread() {
    work_.reset();
    io_.stop();
    t_.join();
  }
  client_thread(const client_thread&) = delete;
  client_thread& operator=(const client_thread&) = delete;
  asio::any_io_executor executor() { return io_.get_executor(); }
  template <class T>
  T run(asio::awaitable<T> a) {
    return asio::co_spawn(io_, std::move(a), asio::use_future).get();
  }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread t_;
};

inline transport::tls_context tls_of(const workspace& w, const std::string& name) {
  return transport::tls_context(transport::tls_files_in(w.certs, name));
}

// Runs a shell command; its exit status.
inline int shell(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace cleave::testing
