// What a stranger or a slow peer can hold of a listener: floods of idle TCP connections (from one
// address and from many) do not keep a device from joining, and a peer trickling a frame after
// login is closed when the frame is overdue.

#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <chrono>
#include <vector>

#include "../support/idle_flood.h"
#include "channel_pair.h"
#include "cleave/transport/connect.h"
#include "cleave/transport/listener.h"
#include "cleave/transport/tls_stream.h"
#include "test_support.h"

using namespace cleave;
using namespace cleave::transport;
using namespace cleave::transport::testing;
using cleave::testing::idle_flood;
using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;

namespace {

// Seconds a device needs to connect and be accepted while the flood holds.
double join_seconds(io_thread& rt, listener& lis) {
  const tls_context device_ctx(pki().device());
  const auto t0 = std::chrono::steady_clock::now();
  auto pair = rt.run(open_pair(lis, device_ctx));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(pair.server.peer_identity() == "device-1");
  return s;
}

}  // namespace

TEST_CASE("2000 idle connections from one address do not keep a device from another address out") {
  io_thread rt;
  listener lis(rt.executor(), tls_context(pki().server()), loopback());
  idle_flood flood(lis.port(), 2000, [](int) { return std::string("127.0.0.2"); });
  const double s = join_seconds(rt, lis);
  MESSAGE("device joined in " << s << " s during a flood of 2000 idle connections from one address");
  CHECK(s < 5.0);
  // All but the per-address allowance were turned away at once, and said so (in few lines).
  CHECK(eventually([&] { return lis.n_refused() >= 2000 - 16; }));
  CHECK(logged("refused connection from 127.0.0.2", "handshakes from that address already in progress"));
  CHECK(eventually([] { return logged("more connections refused in the last second"); }));
}

TEST_CASE("2000 idle connections from 200 addresses: the oldest handshakes make room, a device still joins") {
  io_thread rt;
  listener_options lo;
  lo.max_handshakes = 256;
  listener lis(rt.executor(), tls_context(pki().server()), loopback(), lo);
  idle_flood flood(lis.port(), 2000, [](int i) { return "127.0.1." + std::to_string(1 + i % 200); });
  const double s = join_seconds(rt, lis);
  MESSAGE("device joined in " << s << " s during a flood of 2000 idle connections from 200 addresses");
  CHECK(s < 5.0);
  CHECK(eventually([&] { return lis.n_refused() >= 2000 - 256; }));
  CHECK(eventually([] { return logged("cut off before authentication: all handshake slots taken"); }));
}

TEST_CASE("an idle connection is closed when the pre-authentication deadline passes") {
  io_thread rt;
  listener_options lo;
  lo.handshake_timeout = 300ms;
  listener lis(rt.executor(), tls_context(pki().server()), loopback(), lo);
  {
    idle_flood flood(lis.port(), 3, [](int) { return std::string("127.0.0.3"); });
    CHECK(eventually([&] { return lis.n_refused() == 3; }));
  }
  CHECK(logged("refused connection from 127.0.0.3", "no authenticated peer after 300 ms"));
  CHECK(join_seconds(rt, lis) < 5.0);
}

namespace {

// An authenticated peer announces a frame of `len` bytes, then sends `chunk` bytes of it every
// `every`, `times` times at most; the listener's side must end with a timeout naming the frame.
// Returns how long that took, in seconds.
double overdue_frame(const listener_options& lo, std::uint32_t len, std::size_t chunk, std::chrono::milliseconds every,
                     int times) {
  io_thread rt;
  listener lis(rt.executor(), tls_context(pki().server()), loopback(), lo);
  const tls_context device_ctx(pki().device());
  const auto t0 = std::chrono::steady_clock::now();
  rt.run([&]() -> asio::awaitable<void> {
    auto trickle = [&]() -> asio::awaitable<void> {
      auto ex = co_await asio::this_coro::executor;
      asio::ip::tcp::socket socket(ex);
      co_await socket.async_connect({asio::ip::make_address("127.0.0.1"), lis.port()}, asio::use_awaitable);
      tls_stream s(std::move(socket), device_ctx, tls_stream::side::client);
      REQUIRE((co_await s.handshake()).ok());
      std::vector<std::byte> bytes(4 + chunk * static_cast<std::size_t>(times));
      for (int i = 0; i < 4; ++i) bytes[static_cast<std::size_t>(i)] = std::byte((len >> (8 * i)) & 0xff);
      asio::steady_timer t(ex);
      // The header goes out at the pace of the body, a chunk at a time.
      for (std::size_t at = 0; at < bytes.size(); at += chunk) {
        const std::size_t n = std::min(chunk, bytes.size() - at);
        if (!(co_await s.write_all(std::span<const std::byte>(bytes.data() + at, n))).ok()) break;
        t.expires_after(every);
        co_await t.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
      }
    };
    auto server_side = [&]() -> asio::awaitable<void> {
      auto ch = co_await lis.accept();
      REQUIRE_MESSAGE(ch.ok(), why(ch));
      auto r = co_await ch->receive();
      REQUIRE_FALSE(r.ok());
      CHECK(r.error().code() == errc::timeout);
      CHECK_MESSAGE(r.error().reason().find("a frame of " + std::to_string(len) + " bytes still incomplete after") !=
                        std::string::npos,
                    r.error().reason());
    };
    co_await (trickle() && server_side());
  }());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("an authenticated peer that trickles a frame one byte at a time is closed when the frame is overdue") {
  listener_options lo;
  lo.channel.heartbeat = 20ms;
  lo.channel.idle_timeout = 300ms;
  lo.channel.min_frame_rate = 1000;  // bytes per second: a 204-byte frame is due 0.5 s after it began
  // One byte every 50 ms: far quicker than the idle timeout, far slower than the frame rate.
  const double s = overdue_frame(lo, 200, 1, 50ms, 200);
  CHECK(s < 5.0);  // the trickle alone would take 10 s
  CHECK(logged("closed:", "the peer sends too slowly"));
}

TEST_CASE("a frame sent faster than the minimum rate but announced huge is closed at the absolute frame deadline") {
  listener_options lo;
  lo.channel.heartbeat = 20ms;
  lo.channel.max_frame_time = 1000ms;  // the default rate alone would allow 200 MiB about 1.8 hours
  // 4 KiB every 40 ms: 100 KiB/s, above the minimum rate (32 KiB/s), the whole frame in 34 min.
  const double s = overdue_frame(lo, 200u << 20, 4096, 40ms, 250);
  CHECK(s < 8.0);  // the trickle alone would take 10 s, the frame 34 min
}
