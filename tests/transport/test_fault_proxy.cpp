// Tests of the fault-injecting loopback proxy: forwarding, pause and resume, resets, half-open links,
// delay and the connection counts, against a plain Asio echo server and a blocking client.
#include <doctest/doctest.h>
#include <poll.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fault_proxy.h"

namespace {

using asio::ip::tcp;
using namespace std::chrono_literals;
using cleave::testing::fault_proxy;
using clock_type = std::chrono::steady_clock;

constexpr auto nothrow = asio::experimental::as_tuple(asio::use_awaitable);

// Echoes every byte back on its own io thread; on EOF it closes cleanly. Counts what it saw so the
// tests can tell what reached the server side of the proxy.
class echo_server {
 public:
  echo_server() {
    tcp::endpoint listen_on(asio::ip::address_v4::loopback(), 0);
    acceptor_.open(listen_on.protocol());
    acceptor_.bind(listen_on);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    asio::co_spawn(io_, accept_loop(), [](std::exception_ptr) {});
    thread_ = std::thread([this] { io_.run(); });
  }
  ~echo_server() {
    // Pending sessions are destroyed with the io_context, which closes their sockets.
    io_.stop();
    thread_.join();
  }
  echo_server(const echo_server&) = delete;
  echo_server& operator=(const echo_server&) = delete;

  std::uint16_t port() const { return port_; }
  int n_accepted() const { return n_accepted_; }
  int n_reset() const { return n_reset_; }

 private:
  asio::awaitable<void> accept_loop() {
    for (;;) {
      auto [ec, socket] = co_await acceptor_.async_accept(nothrow);
      if (ec) co_return;
      ++n_accepted_;
      asio::co_spawn(io_, echo(std::move(socket)), [](std::exception_ptr) {});
    }
  }

  asio::awaitable<void> echo(tcp::socket socket) {
    std::vector<char> buffer(64 * 1024);
    for (;;) {
      auto [ec, n] = co_await socket.async_read_some(asio::buffer(buffer), nothrow);
      if (ec == asio::error::eof) {
        asio::error_code ignored;
        socket.shutdown(tcp::socket::shutdown_send, ignored);
        co_return;
      }
      if (ec == asio::error::connection_reset) ++n_reset_;
      if (ec) co_return;
      auto [write_ec, written] = co_await asio::async_write(socket, asio::buffer(buffer.data(), n), nothrow);
      if (write_ec == asio::error::connection_reset) ++n_reset_;
      if (write_ec) co_return;
    }
  }

  asio::io_context io_{1};
  tcp::acceptor acceptor_{io_};
  std::uint16_t port_ = 0;
  std::atomic<int> n_accepted_{0};
  std::atomic<int> n_reset_{0};
  std::thread thread_;
};

struct read_result {
  std::string data;
  asio::error_code ec;     // what ended the read early (eof, connection_reset), if anything
  bool timed_out = false;  // the limit passed before n bytes came
};

// A blocking client whose reads have a time limit (poll before each read).
class blocking_client {
 public:
  explicit blocking_client(std::uint16_t port) {
    tcp::endpoint target(asio::ip::address_v4::loopback(), port);
    socket_.connect(target);
    socket_.set_option(tcp::no_delay(true));
  }

  void send(std::string_view bytes) { asio::write(socket_, asio::buffer(bytes.data(), bytes.size())); }
  void shutdown_send() { socket_.shutdown(tcp::socket::shutdown_send); }
  // Unblocks a thread stuck in send() when a test fails.
  void shutdown_both() {
    asio::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
  }
  void close() { socket_.close(); }
  tcp::socket& socket() { return socket_; }

  // Reads n bytes, waiting at most `limit` in all.
  read_result read(std::size_t n, std::chrono::milliseconds limit) {
    read_result r;
    const auto deadline = clock_type::now() + limit;
    std::vector<char> buffer(64 * 1024);
    while (r.data.size() < n) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
      if (left <= 0ms) {
        r.timed_out = true;
        break;
      }
      pollfd p{};
      p.fd = socket_.native_handle();
      p.events = POLLIN;
      const int k = ::poll(&p, 1, static_cast<int>(left.count()) + 1);
      if (k < 0 && errno == EINTR) continue;
      if (k == 0) continue;  // the deadline check above decides
      const std::size_t want = std::min(buffer.size(), n - r.data.size());
      const std::size_t got = socket_.read_some(asio::buffer(buffer.data(), want), r.ec);
      if (r.ec) break;
      r.data.append(buffer.data(), got);
    }
    return r;
  }

  // Sends bytes and reads as many back.
  read_result echo(std::string_view bytes, std::chrono::milliseconds limit = 10s) {
    send(bytes);
    return read(bytes.size(), limit);
  }

 private:
  asio::io_context io_;
  tcp::socket socket_{io_};
};

// Polls pred until it holds or `limit` passes: the proxy's accepts and closes are asynchronous.
bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds limit = 10s) {
  const auto deadline = clock_type::now() + limit;
  while (!pred()) {
    if (clock_type::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

std::string pattern(std::size_t n) {
  std::string s(n, '\0');
  std::uint32_t x = 12345;
  for (auto& c : s) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

}  // namespace

TEST_SUITE("fault_proxy") {
  TEST_CASE("bytes are forwarded both ways, in order") {
    echo_server server;
    fault_proxy proxy(server.port());
    blocking_client client(proxy.port());

    CHECK_EQ(client.echo("hello").data, "hello");

    // More than the proxy's chunk and the socket buffers: the sender needs its own thread.
    const std::string big = pattern(1 << 20);
    std::thread sender([&] {
      try {
        client.send(big);
      } catch (const std::exception&) {
        // The read below reports the failure.
      }
    });
    const read_result back = client.read(big.size(), 30s);
    if (back.data.size() != big.size()) client.shutdown_both();
    sender.join();
    CHECK_FALSE(back.timed_out);
    CHECK_FALSE(back.ec);
    CHECK(back.data == big);
  }

  TEST_CASE("a clean close on one side is passed on as a clean close") {
    echo_server server;
    fault_proxy proxy(server.port());
    blocking_client client(proxy.port());
    CHECK_EQ(client.echo("ping").data, "ping");

    client.shutdown_send();
    // The echo server sees EOF and closes; that close comes back to the client as EOF, not a reset.
    const read_result r = client.read(1, 10s);
    CHECK(r.data.empty());
    CHECK_EQ(r.ec, asio::error_code(asio::error::eof));
    CHECK(wait_until([&] { return proxy.n_open() == 0; }));
    CHECK_EQ(server.n_reset(), 0);
  }

  TEST_CASE("pause holds bytes and resume delivers them in order") {
    echo_server server;
    fault_proxy proxy(server.port());
    blocking_client client(proxy.port());
    CHECK_EQ(client.echo("ping").data, "ping");

    proxy.pause();
    client.send("abc");
    const read_result held = client.read(3, 200ms);
    CHECK(held.timed_out);
    CHECK(held.data.empty());
    CHECK_FALSE(held.ec);
    client.send("def");
    CHECK_EQ(proxy.n_open(), 1);  // held, not dropped

    proxy.resume();
    const read_result r = client.read(6, 10s);
    CHECK_FALSE(r.timed_out);
    CHECK_EQ(r.data, "abcdef");
    CHECK_EQ(client.echo("again").data, "again");
  }

  TEST_CASE("a connection made while paused is accepted but held until resume") {
    echo_server server;
    fault_proxy proxy(server.port());
    proxy.pause();

    blocking_client client(proxy.port());
    CHECK(wait_until([&] { return proxy.n_accepted() == 1; }));
    client.send("x");
    const read_result held = client.read(1, 200ms);
    CHECK(held.timed_out);
    CHECK(held.data.empty());
    CHECK_EQ(server.n_accepted(), 0);  // the server has not seen it yet

    proxy.resume();
    const read_result r = client.read(1, 10s);
    CHECK_EQ(r.data, "x");
    CHECK_EQ(server.n_accepted(), 1);
  }

  TEST_CASE("reset_all resets every connection on both sides instead of closing it") {
    echo_server server;
    fault_proxy proxy(server.port());
    blocking_client client(proxy.port());
    CHECK_EQ(client.echo("ping").data, "ping");

    proxy.reset_all();
    CHECK_EQ(proxy.n_open(), 0);
    const read_result r = client.read(1, 10s);
    CHECK(r.data.empty());
    CHECK_FALSE(r.timed_out);
    CHECK_EQ(r.ec, asio::error_code(asio::error::connection_reset));
    CHECK(wait_until([&] { return server.n_reset() == 1; }));

    // The proxy itself keeps working.
    blocking_client again(proxy.port());
    CHECK_EQ(again.echo("pong").data, "pong");
  }

  TEST_CASE("half_open silences open connections for good while new ones work") {
    echo_server server;
    fault_proxy proxy(server.port());
    blocking_client lost(proxy.port());
    CHECK_EQ(lost.echo("ping").data, "ping");

    proxy.half_open();
    CHECK_EQ(proxy.n_open(), 0);
    lost.send("anyone?");
    const read_result silent = lost.read(1, 300ms);
    CHECK(silent.timed_out);
    CHECK(silent.data.empty());
    CHECK_FALSE(silent.ec);  // neither data nor EOF nor reset

    blocking_client fresh(proxy.port());
    CHECK_EQ(fresh.echo("pong").data, "pong");
    CHECK_EQ(proxy.n_accepted(), 2);
    CHECK_EQ(proxy.n_open(), 1);

    // Still silent after other traffic went through, and resume() does not revive it.
    proxy.resume();
    const read_result still = lost.read(1, 100ms);
    CHECK(still.timed_out);
    CHECK(still.data.empty());
    CHECK_FALSE(still.ec);
    CHECK_EQ(server.n_reset(), 0);
  }

  TEST_CASE("set_delay delays each chunk in each direction") {
    echo_server server;
    fault_proxy proxy(server.port());
    blocking_client client(proxy.port());
    CHECK_EQ(client.echo("warm").data, "warm");

    proxy.set_delay(100ms);
    const auto start = clock_type::now();
    const read_result r = client.echo("x");
    const auto elapsed = clock_type::now() - start;
    CHECK_EQ(r.data, "x");
    // Once on the way to the server, once on the way back: only a lower bound, the machine may be loaded.
    CHECK(elapsed >= 200ms);

    proxy.set_delay(0ms);
    CHECK_EQ(client.echo("fast").data, "fast");
  }

  TEST_CASE("n_accepted and n_open count connections") {
    echo_server server;
    fault_proxy proxy(server.port());
    CHECK_EQ(proxy.n_accepted(), 0);
    CHECK_EQ(proxy.n_open(), 0);

    blocking_client a(proxy.port());
    blocking_client b(proxy.port());
    CHECK(wait_until([&] { return proxy.n_accepted() == 2 && proxy.n_open() == 2; }));
    CHECK_EQ(a.echo("a").data, "a");
    CHECK_EQ(b.echo("b").data, "b");

    a.close();
    CHECK(wait_until([&] { return proxy.n_open() == 1; }));
    CHECK_EQ(proxy.n_accepted(), 2);
    CHECK_EQ(b.echo("still").data, "still");
  }

  TEST_CASE("a target that refuses the connection resets the client") {
    std::uint16_t closed_port = 0;
    {
      // A port that was free a moment ago and has no listener now.
      asio::io_context io;
      tcp::acceptor probe(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
      closed_port = probe.local_endpoint().port();
    }
    fault_proxy proxy(closed_port);
    blocking_client client(proxy.port());
    const read_result r = client.read(1, 10s);
    CHECK(r.data.empty());
    CHECK_EQ(r.ec, asio::error_code(asio::error::connection_reset));
    CHECK_EQ(proxy.n_accepted(), 1);
    CHECK(wait_until([&] { return proxy.n_open() == 0; }));
  }
}
