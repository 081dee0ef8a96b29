// The node's executors: the I/O loop, the compute thread, signals and the one path by which a
// node stops (asked, signalled, or failed).
#include "cleave/runtime/executors.h"

#include "cleave/core/error.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <asio/experimental/as_tuple.hpp>
#include <future>
#include <mutex>
#include <optional>

#include "cleave/runtime/node_config.h"
#include "cleave/runtime/node_metrics.h"

namespace cleave::runtime {

void prepare_process() {
  static std::once_flag once;
  std::call_once(once, [] {
    ::signal(SIGPIPE, SIG_IGN);
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? rlim_t{1} << 20 : lim.rlim_max;
      if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) spdlog::debug("cannot raise the open-file limit");
    }
  });
}

executors::executors(std::string who) : who_(std::move(who)), work_guard_(asio::make_work_guard(work_)), signals_(io_) {
  prepare_process();
  declare_node_metrics(metrics_);
  set_build_info(metrics_);
  metrics_.on_collect([this] {
    metrics_.set("cleave_process_resident_memory_bytes", {}, static_cast<double>(metrics::resident_bytes()));
    metrics_.set("cleave_process_peak_resident_memory_bytes", {}, static_cast<double>(metrics::peak_resident_bytes()));
  });
}

executors::~executors() {
  exporter_.reset();
  pages_.clear();
  work_guard_.reset();
  work_.stop();
  if (worker_.joinable()) worker_.join();
}

void executors::stop_on_signals() {
  signals_.add(SIGINT);
  signals_.add(SIGTERM);
  signals_.add(SIGHUP);
  wait_for_signal();
}

void executors::wait_for_signal() {
  signals_.async_wait([this](const std::error_code& ec, int sig) {
    if (ec || stopping_) return;
    if (sig != SIGHUP) return begin_stop(sig == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)");
    spdlog::info("{}: SIGHUP: {}", who_, reload_ ? "reloading" : "nothing to reload");
    try {
      if (reload_) reload_();
    } catch (const std::exception& e) {  // a reload never takes the node down
      spdlog::error("{}: reload failed, running on as before: {}", who_, e.what());
    }
    wait_for_signal();
  });
}

void executors::run() {
  worker_ = std::thread([this] {
    try {
      work_.run();
    } catch (...) {
      // Compute tasks catch their own errors; anything else is a bug that must not vanish.
      auto e = std::current_exception();
      post_io([this, e] { fail(e, "compute thread"); });
    }
  });
  io_.run();
  exporter_.reset();  // metrics and pages are served while the node runs
  pages_.clear();
  work_guard_.reset();
  worker_.join();
  if (failure_) std::rethrow_exception(failure_);
}

void executors::stop(std::string why) {
  post_io([this, why = std::move(why)] { begin_stop(why); });
}

void executors::fail(std::exception_ptr e, const std::string& what) {
  const std::string text = core::message_of(e);
  spdlog::error("{}: {} failed: {}", who_, what, text);
  if (!failure_) failure_ = e;
  begin_stop(what + " failed: " + text);
}

void executors::serve_metrics(const node_config& c, std::function<std::string()> not_ready) {
  // Asked on the exporter's thread, answered on the I/O thread (what the node's state is read
  // on); a node whose I/O thread does not answer within a second is not ready either.
  auto ask = [this, check = std::make_shared<std::function<std::string()>>(std::move(not_ready))] {
    auto why = std::make_shared<std::string>();
    const bool answered = run_on_io(
        [this, check, why] { *why = stopping_ ? "draining: " + stop_reason_
                                    : *check  ? (*check)()
                                              : std::string(); },
        std::chrono::seconds(1));
    return answered ? *why : std::string("its I/O thread did not answer within a second");
  };
  try {
    metrics::http_options o;
    o.token = c.metrics_token;
    o.is_public = c.metrics_public;
    exporter_ = std::make_unique<metrics::exporter>(metrics_, c.metrics, std::move(o), std::move(ask));
  } catch (const std::exception& e) {
    throw core::error(e.what());
  }
  spdlog::info("{}: metrics on http://{}:{}/metrics{}", who_, exporter_->host(), exporter_->port(),
               c.metrics_token.empty() ? "" : " (with a token)");
  if (c.metrics_token.empty() && !metrics::is_loopback_host(exporter_->host()))
    spdlog::warn(
        "{}: --metrics-public: anyone who reaches {}:{} reads this node's metrics (its peers' names, "
        "routes, losses, memory)",
        who_, exporter_->host(), exporter_->port());
}

void executors::collect_on_io(std::function<void()> f) {
  metrics_.on_collect([this, f = std::move(f)] { run_on_io(f, std::chrono::seconds(1)); });
}

std::uint16_t executors::serve_pages(const std::string& address, std::vector<metrics::page> pages,
                                     metrics::http_options o) {
  try {
    pages_.push_back(std::make_unique<metrics::http_server>(address, std::move(pages), std::move(o)));
  } catch (const std::exception& e) {
    throw core::error(e.what());
  }
  return pages_.back()->port();
}

bool executors::run_on_io(std::function<void()> f, std::chrono::milliseconds wait) {
  auto done = std::make_shared<std::promise<void>>();
  auto ready = done->get_future();
  post_io([f = std::move(f), done] {
    f();
    done->set_value();
  });
  return ready.wait_for(wait) == std::future_status::ready;
}

void executors::spawn(asio::awaitable<void> a, std::string what, thread on) {
  asio::co_spawn(on == thread::io ? io_ : work_, std::move(a),
                 [this, on, what = std::move(what)](std::exception_ptr e) {
                   if (!e) return;
                   if (on == thread::io) return fail(e, what);
                   post_io([this, e, what] { fail(e, what); });
                 });
}

void executors::begin_stop(const std::string& why) {
  if (stopping_) return;
  stopping_ = true;
  stop_reason_ = why;
  signals_.cancel();
  if (!shutdown_) {
    io_.stop();
    return;
  }
  auto task = shutdown_(why);
  asio::co_spawn(io_, std::move(task), [this](std::exception_ptr e) {
    if (e && !failure_) failure_ = e;
    io_.stop();
  });
}

asio::awaitable<bool> signal::wait_until(std::function<bool()> pred, std::chrono::steady_clock::time_point deadline) {
  constexpr auto nothrow = asio::experimental::as_tuple(asio::use_awaitable);
  std::optional<asio::steady_timer> alarm;
  if (deadline != std::chrono::steady_clock::time_point::max()) {
    // Wakes every waiter at this one's deadline; the others re-check and wait on.
    alarm.emplace(timer_.get_executor(), deadline);
    alarm->async_wait([this](const std::error_code& ec) {
      if (!ec) notify();
    });
  }
  while (!pred() && std::chrono::steady_clock::now() < deadline) co_await timer_.async_wait(nothrow);
  co_return pred();
}

}  // namespace cleave::runtime
