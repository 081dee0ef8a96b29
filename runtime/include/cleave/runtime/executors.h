// The two executors of a node process: one I/O thread (every channel, every bookkeeping
// decision) and one compute thread (every kernel), one way of posting between them, and the
// lifetime of both: signals, failures and shutdown end in one place.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>

#include "cleave/core/error.h"
#include "cleave/metrics/exporter.h"
#include "cleave/metrics/registry.h"

namespace cleave::runtime {

struct node_config;

// Process settings every node needs before it opens a socket (idempotent): SIGPIPE never kills
// it (a write to a peer that reset the connection is an error value), and its soft limit on open
// files is raised to the hard one, so that a flood of connections meets the listener's own
// limits rather than the system's 1024 descriptors.
void prepare_process();

class executors {
 public:
  // `who` prefixes the node's log lines ("server", "edge 1000", "device 3").
  explicit executors(std::string who);
  ~executors();
  executors(const executors&) = delete;
  executors& operator=(const executors&) = delete;

  asio::io_context& io() { return io_; }
  asio::io_context& work() { return work_; }  // the compute thread's
  const std::string& who() const { return who_; }
  bool stopping() const { return stopping_; }  // I/O thread
  const std::string& stop_reason() const { return stop_reason_; }

  // The node's orderly shutdown (tell peers, close channels), run once on the I/O thread when
  // the node stops for any reason; run() returns after it completes.
  void on_shutdown(std::function<asio::awaitable<void>(std::string why)> f) { shutdown_ = std::move(f); }
  // What the node reloads on SIGHUP, run on the I/O thread; an exception it throws is logged and
  // the node runs on.
  void on_reload(std::function<void()> f) { reload_ = std::move(f); }
  // SIGINT and SIGTERM stop the node; SIGHUP runs the reload handler (the handlers belong to the
  // I/O loop: nothing outlives it).
  void stop_on_signals();

  // Runs the I/O loop on the calling thread and the compute thread beside it until the node has
  // shut down; rethrows the exception that stopped it, if one did.
  void run();
  // Thread-safe: shuts the node down.
  void stop(std::string why);
  // I/O thread: as stop(), recording an unexpected failure that run() rethrows.
  void fail(std::exception_ptr e, const std::string& what);

  // The node's metrics (node_metrics.h declares them), and their HTTP endpoint: serve_metrics()
  // binds ADDR (see metrics::parse_listen_address; core::error when it cannot) and serves
  // /metrics, /healthz and /readyz until run() returns. Ready: not stopping, and `not_ready`
  // (run on the I/O thread) says nothing.
  metrics::registry& metrics() { return metrics_; }
  // The address, token and public flag are the node's (node_config): beyond loopback it needs a
  // token (metrics::http_options) unless public (warned).
  void serve_metrics(const node_config& c, std::function<std::string()> not_ready = {});
  // Before every scrape: f on the I/O thread (what only that thread may read: sessions, links),
  // waited for up to a second (a scrape of a busy or stopped node shows what it had).
  void collect_on_io(std::function<void()> f);
  // Other pages of the node (the server's dashboard) on ADDR, served as /metrics is, until run()
  // returns; core::error when it cannot. Returns the port bound.
  std::uint16_t serve_pages(const std::string& address, std::vector<metrics::page> pages, metrics::http_options o);
  // From any thread but the I/O thread: f run there, waited for up to `wait`; false when it did
  // not run in time (it may run later: f must own what it writes to).
  bool run_on_io(std::function<void()> f, std::chrono::milliseconds wait);

  // Starts a coroutine on the I/O thread, or the compute thread (for work that waits on that
  // thread's own events); an exception escaping it is logged and stops the node.
  enum class thread : std::uint8_t { io, compute };
  void spawn(asio::awaitable<void> a, std::string what, thread on = thread::io);

  template <class F>
  void post_io(F&& f) {
    asio::post(io_, std::forward<F>(f));
  }
  template <class F>
  void post_compute(F&& f) {
    asio::post(work_, std::forward<F>(f));
  }
  // f, made to hand a core::error it throws to on_error(what) on the I/O thread (post it to the
  // compute thread: post_compute(guarded(f, on_error))).
  template <class F, class E>
  auto guarded(F f, E on_error) {
    return [this, f = std::move(f), on_error = std::move(on_error)]() mutable {
      try {
        f();
      } catch (const core::error& e) {
        post_io([on_error, why = std::string(e.what())] { on_error(why); });
      }
    };
  }
  // From a coroutine on the I/O thread: runs f on the compute thread and resumes with its
  // result (exceptions travel too).
  template <class F>
  asio::awaitable<std::invoke_result_t<F&>> compute(F f) {
    using R = std::invoke_result_t<F&>;
    // Named, not a temporary inside the co_await expression: g++ 12 destroys those twice.
    auto task = [f = std::move(f)]() mutable -> asio::awaitable<R> { co_return f(); };
    co_return co_await asio::co_spawn(work_, std::move(task), asio::use_awaitable);
  }

 private:
  void begin_stop(const std::string& why);
  void wait_for_signal();

  std::string who_;
  asio::io_context io_, work_;
  asio::executor_work_guard<asio::io_context::executor_type> work_guard_;
  std::thread worker_;
  asio::signal_set signals_;
  std::function<asio::awaitable<void>(std::string)> shutdown_;
  std::function<void()> reload_;
  bool stopping_ = false;
  std::string stop_reason_;
  std::exception_ptr failure_;
  metrics::registry metrics_;
  std::unique_ptr<metrics::exporter> exporter_;               // destroyed first: it reads metrics_ and posts to io_
  std::vector<std::unique_ptr<metrics::http_server>> pages_;  // as exporter_
};

// A condition coroutines on the I/O thread wait for: notify() wakes every waiter, which then
// re-checks what it waits for. wait_until() also ends at a deadline.
class signal {
 public:
  explicit signal(asio::io_context& io) : timer_(io, std::chrono::steady_clock::time_point::max()) {}
  void notify() { timer_.cancel(); }
  // Waits until pred() holds or the deadline passes; returns pred().
  asio::awaitable<bool> wait_until(std::function<bool()> pred, std::chrono::steady_clock::time_point deadline =
                                                                   std::chrono::steady_clock::time_point::max());

 private:
  asio::steady_timer timer_;
};

}  // namespace cleave::runtime
