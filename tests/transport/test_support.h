// Shared pieces of the channel tests: a throw-away PKI made with the provisioning API, an
// io_context on its own thread, and a capture of the transport log.
#pragma once

#include <doctest/doctest.h>
#include <spdlog/sinks/ringbuffer_sink.h>

#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include "cleave/transport/certs.h"
#include "cleave/transport/log.h"
#include "cleave/transport/tls_context.h"

namespace cleave::transport::testing {

// Certificates of a small federation, made once per test process in a temporary directory.
struct test_pki {
  std::filesystem::path dir;        // CA, server-1, edge-1, device-1, device-2, device-old
  std::filesystem::path other_dir;  // another CA and device-x signed by it
  tls_files server() const { return tls_files_in(dir, "server-1"); }
  tls_files edge() const { return tls_files_in(dir, "edge-1"); }
  tls_files device() const { return tls_files_in(dir, "device-1"); }
  tls_files device2() const { return tls_files_in(dir, "device-2"); }
  tls_files expired() const {
    auto f = tls_files_in(dir, "device-old");
    f.check_own_certificate = false;
    return f;
  }
  tls_files foreign() const {
    tls_files f{dir / "ca.crt", other_dir / "device-x.crt", other_dir / "device-x.key", false};
    return f;
  }
  tls_files no_certificate() const { return tls_files{dir / "ca.crt", {}, {}, true}; }

  test_pki() = default;
  test_pki(const test_pki&) = delete;
  test_pki& operator=(const test_pki&) = delete;
  ~test_pki() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    if (!other_dir.empty()) std::filesystem::remove_all(other_dir, ec);
  }
};

inline std::filesystem::path make_temp_dir(const std::string& tag) {
  std::string templ = (std::filesystem::temp_directory_path() / ("cleave-" + tag + "-XXXXXX")).string();
  REQUIRE(::mkdtemp(templ.data()) != nullptr);
  return templ;
}

// Fills `t` (made once per process by pki()).
inline void provision(test_pki& t) {
  t.dir = make_temp_dir("pki");
  t.other_dir = make_temp_dir("pki-other");
  init_ca(t.dir);
  issue_options server;
  server.role = core::tier::server;
  server.dns_names = {"localhost"};
  server.ip_addresses = {"127.0.0.1"};
  issue_certificate(t.dir, "server-1", server);
  issue_options edge;
  edge.role = core::tier::edge;
  issue_certificate(t.dir, "edge-1", edge);
  issue_options device;
  device.role = core::tier::device;
  issue_certificate(t.dir, "device-1", device);
  issue_certificate(t.dir, "device-2", device);
  issue_options old = device;
  old.not_before = std::chrono::system_clock::now() - std::chrono::hours(24 * 30);
  old.not_after = std::chrono::system_clock::now() - std::chrono::hours(24);
  issue_certificate(t.dir, "device-old", old);
  ca_options other;
  other.name = "some other CA";
  init_ca(t.other_dir, other);
  issue_certificate(t.other_dir, "device-x", device);
}

inline const test_pki& pki() {
  static test_pki p;  // its destructor removes the directories at exit
  static const bool ready = (provision(p), true);
  (void)ready;
  return p;
}

// The transport log, captured for checks on what was logged.
inline std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> log_capture() {
  static const auto sink = [] {
    auto s = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(512);
    logger()->sinks().push_back(s);
    logger()->set_level(spdlog::level::debug);
    return s;
  }();
  return sink;
}

inline bool logged(const std::string& a, const std::string& b = {}) {
  for (const auto& line : log_capture()->last_formatted())
    if (line.find(a) != std::string::npos && line.find(b) != std::string::npos) return true;
  return false;
}

// Polls `pred` (thread-safe) until true or `limit` passes; never a timed assertion, only a bound
// on how long a broken build may hang.
inline bool eventually(const std::function<bool()>& pred, std::chrono::seconds limit = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// An io_context running on its own thread.
class io_thread {
 public:
  io_thread() : work_(io_.get_executor()), thread_([this] { io_.run(); }) {}
  ~io_thread() {
    work_.reset();
    io_.stop();
    thread_.join();
  }
  asio::io_context& io() { return io_; }
  asio::any_io_executor executor() { return io_.get_executor(); }

  // Runs a coroutine on the io thread and waits for its result (bounded, so a hang fails).
  template <class T>
  T run(asio::awaitable<T> a, std::chrono::seconds limit = std::chrono::seconds(60)) {
    auto fut = asio::co_spawn(io_, std::move(a), asio::use_future);
    REQUIRE_MESSAGE(fut.wait_for(limit) == std::future_status::ready, "coroutine did not finish");
    return fut.get();
  }

 private:
  bool logs_ = (log_capture(), true);  // before the thread starts logging
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
};

inline asio::awaitable<void> sleep_for(std::chrono::milliseconds d) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  t.expires_after(d);
  co_await t.async_wait(asio::use_awaitable);
}

}  // namespace cleave::transport::testing
