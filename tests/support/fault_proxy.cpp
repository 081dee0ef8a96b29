// The fault-injecting loopback TCP proxy of the tests: all state lives on one io thread; one coroutine
// per connection connects to the target, then one coroutine per direction moves bytes a chunk at a time.
#include "fault_proxy.h"

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <cstdio>
#include <exception>
#include <future>
#include <thread>
#include <utility>
#include <vector>

namespace cleave::testing {
namespace {

using asio::ip::tcp;
using clock_type = std::chrono::steady_clock;

// Errors come back as values: a peer that goes away is what this proxy is for, not an exception.
constexpr auto nothrow = asio::experimental::as_tuple(asio::use_awaitable);
constexpr std::size_t chunk_bytes = 64 * 1024;

enum class link_state { connecting, open, closed, silenced };

struct connection {
  explicit connection(tcp::socket accepted)
      : client(std::move(accepted)),
        server(client.get_executor()),
        to_server_timer(client.get_executor()),
        to_client_timer(client.get_executor()) {}

  tcp::socket client;  // the side that connected to the proxy
  tcp::socket server;  // the side the proxy connected to
  // Each direction waits (pause, delay) on its own timer; cancelling it makes that direction look
  // at the state again, the way a condition variable would.
  asio::steady_timer to_server_timer;
  asio::steady_timer to_client_timer;
  link_state state = link_state::connecting;
  int n_eof = 0;  // directions that ended with a clean EOF

  void wake() {
    to_server_timer.cancel();
    to_client_timer.cancel();
  }
};

void log_failure(std::exception_ptr e) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    std::fprintf(stderr, "fault_proxy: %s\n", x.what());
  } catch (...) {
    std::fprintf(stderr, "fault_proxy: unknown exception\n");
  }
}

}  // namespace

struct fault_proxy::impl {
  explicit impl(std::uint16_t target);
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;

  // Runs f on the io thread and waits for it: every public method has taken effect when it returns.
  template <class F>
  auto on_io(F f) -> decltype(f()) {
    if (io.get_executor().running_in_this_thread()) return f();
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    asio::post(io, [&task] { task(); });
    return result.get();
  }

  void spawn(asio::awaitable<void> a) {
    asio::co_spawn(io, std::move(a), [](std::exception_ptr e) { log_failure(e); });
  }

  asio::awaitable<void> accept_loop();
  asio::awaitable<void> run_connection(std::shared_ptr<connection> c);
  asio::awaitable<void> pump(std::shared_ptr<connection> c, bool to_server);

  void forget(const connection& c) {
    std::erase_if(open, [&](const std::shared_ptr<connection>& o) { return o.get() == &c; });
  }
  void close_clean(connection& c);
  void reset(connection& c);
  void silence(connection& c);
  void wake_all() {
    for (auto& c : open) c->wake();
  }
  void shutdown_all();

  const std::uint16_t target_port;
  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  tcp::acceptor acceptor{io};
  std::uint16_t listen_port = 0;
  // Touched on the io thread only.
  std::vector<std::shared_ptr<connection>> open;      // connecting or forwarding
  std::vector<std::shared_ptr<connection>> silenced;  // kept so that their sockets stay open for good
  bool paused = false;
  std::chrono::milliseconds delay{0};
  int n_accepted = 0;
  std::thread thread;
};

fault_proxy::impl::impl(std::uint16_t target) : target_port(target) {
  tcp::endpoint listen_on(asio::ip::address_v4::loopback(), 0);
  acceptor.open(listen_on.protocol());
  acceptor.bind(listen_on);
  acceptor.listen();
  listen_port = acceptor.local_endpoint().port();
  spawn(accept_loop());
  thread = std::thread([this] {
    // Handlers do not throw (co_spawn's handler logs); the loop only guards against surprises.
    for (;;) {
      try {
        io.run();
        return;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "fault_proxy: io thread: %s\n", e.what());
      }
    }
  });
}

asio::awaitable<void> fault_proxy::impl::accept_loop() {
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(nothrow);
    if (!acceptor.is_open()) co_return;
    if (ec) {
      // Out of descriptors or similar: back off a little rather than spin.
      asio::steady_timer backoff(io, std::chrono::milliseconds(10));
      co_await backoff.async_wait(nothrow);
      continue;
    }
    ++n_accepted;
    asio::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto c = std::make_shared<connection>(std::move(socket));
    open.push_back(c);
    spawn(run_connection(std::move(c)));
  }
}

asio::awaitable<void> fault_proxy::impl::run_connection(std::shared_ptr<connection> c) {
  // A connection accepted while paused is held: the target sees it only after resume().
  while (paused && c->state == link_state::connecting) {
    c->to_server_timer.expires_at(clock_type::time_point::max());
    co_await c->to_server_timer.async_wait(nothrow);
  }
  if (c->state != link_state::connecting) co_return;
  tcp::endpoint target(asio::ip::address_v4::loopback(), target_port);
  auto [ec] = co_await c->server.async_connect(target, nothrow);
  if (c->state != link_state::connecting) co_return;  // reset or silenced meanwhile
  if (ec) {
    reset(*c);
    co_return;
  }
  asio::error_code ignored;
  c->server.set_option(tcp::no_delay(true), ignored);
  c->state = link_state::open;
  spawn(pump(c, true));
  spawn(pump(std::move(c), false));
}

asio::awaitable<void> fault_proxy::impl::pump(std::shared_ptr<connection> c, bool to_server) {
  tcp::socket& from = to_server ? c->client : c->server;
  tcp::socket& to = to_server ? c->server : c->client;
  asio::steady_timer& timer = to_server ? c->to_server_timer : c->to_client_timer;
  // One chunk in flight per direction: held bytes beyond it wait in the kernel's socket buffers.
  std::vector<char> buffer(chunk_bytes);
  for (;;) {
    auto [read_ec, n] = co_await from.async_read_some(asio::buffer(buffer), nothrow);
    const auto read_at = clock_type::now();
    if (c->state != link_state::open) co_return;
    const bool eof = read_ec == asio::error::eof;
    if (read_ec && !eof) {
      reset(*c);
      co_return;
    }
    // Hold the chunk (or the EOF, which must follow the held bytes) while paused or delayed.
    for (;;) {
      if (c->state != link_state::open) co_return;
      if (paused) {
        timer.expires_at(clock_type::time_point::max());
      } else if (clock_type::now() < read_at + delay) {
        timer.expires_at(read_at + delay);
      } else {
        break;
      }
      co_await timer.async_wait(nothrow);
    }
    if (eof) {
      asio::error_code ignored;
      to.shutdown(tcp::socket::shutdown_send, ignored);
      if (++c->n_eof == 2) close_clean(*c);
      co_return;
    }
    auto [write_ec, written] = co_await asio::async_write(to, asio::buffer(buffer.data(), n), nothrow);
    if (c->state != link_state::open) co_return;
    if (write_ec) {
      reset(*c);
      co_return;
    }
  }
}

void fault_proxy::impl::close_clean(connection& c) {
  if (c.state == link_state::closed || c.state == link_state::silenced) return;
  asio::error_code ignored;
  c.client.close(ignored);
  c.server.close(ignored);
  c.state = link_state::closed;
  c.wake();
  forget(c);
}

void fault_proxy::impl::reset(connection& c) {
  if (c.state == link_state::closed || c.state == link_state::silenced) return;
  asio::error_code ignored;
  for (tcp::socket* s : {&c.client, &c.server}) {
    if (!s->is_open()) continue;
    // Linger 0 turns close into a RST: the peer's next read fails with ECONNRESET, not EOF.
    s->set_option(asio::socket_base::linger(true, 0), ignored);
    s->close(ignored);
  }
  c.state = link_state::closed;
  c.wake();
  forget(c);
}

void fault_proxy::impl::silence(connection& c) {
  if (c.state == link_state::closed || c.state == link_state::silenced) return;
  c.state = link_state::silenced;
  // cancel() stops the pending reads and writes without closing: the peers notice nothing.
  asio::error_code ignored;
  c.client.cancel(ignored);
  c.server.cancel(ignored);
  c.wake();
  forget(c);
}

void fault_proxy::impl::shutdown_all() {
  asio::error_code ignored;
  acceptor.close(ignored);
  for (auto* list : {&open, &silenced}) {
    for (auto& c : *list) {
      c->client.close(ignored);
      c->server.close(ignored);
      c->state = link_state::closed;
      c->wake();
    }
    list->clear();
  }
}

fault_proxy::fault_proxy(std::uint16_t target_port) : impl_(std::make_unique<impl>(target_port)) {}

fault_proxy::~fault_proxy() {
  impl_->on_io([this] { impl_->shutdown_all(); });
  // Every socket is closed and every timer woken, so each coroutine ends and run() returns.
  impl_->work.reset();
  impl_->thread.join();
}

std::uint16_t fault_proxy::port() const {
  return impl_->listen_port;
}

void fault_proxy::pause() {
  impl_->on_io([this] { impl_->paused = true; });
}

void fault_proxy::resume() {
  impl_->on_io([this] {
    impl_->paused = false;
    impl_->wake_all();
  });
}

void fault_proxy::reset_all() {
  impl_->on_io([this] {
    auto all = std::move(impl_->open);
    impl_->open.clear();
    for (auto& c : all) impl_->reset(*c);
  });
}

void fault_proxy::half_open() {
  impl_->on_io([this] {
    auto all = std::move(impl_->open);
    impl_->open.clear();
    for (auto& c : all) {
      impl_->silence(*c);
      impl_->silenced.push_back(std::move(c));
    }
  });
}

void fault_proxy::set_delay(std::chrono::milliseconds d) {
  impl_->on_io([this, d] {
    impl_->delay = std::max(d, std::chrono::milliseconds(0));
    impl_->wake_all();
  });
}

int fault_proxy::n_accepted() const {
  return impl_->on_io([this] { return impl_->n_accepted; });
}

int fault_proxy::n_open() const {
  return impl_->on_io([this] { return static_cast<int>(impl_->open.size()); });
}

}  // namespace cleave::testing
