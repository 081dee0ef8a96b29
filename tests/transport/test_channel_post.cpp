// Channels posted to from other threads: order per thread, backpressure that reaches the
// posting thread, posts on a closed channel and on the channel's own executor.
#include <asio/experimental/awaitable_operators.hpp>
#include <atomic>
#include <thread>

#include "channel_pair.h"
#include "cleave/protocol/protocol.h"
#include "cleave/transport/channel.h"
#include "cleave/transport/listener.h"
#include "test_support.h"

using namespace cleave;
using namespace cleave::transport;
using namespace cleave::transport::testing;
using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;

namespace {

message_builder round_start(std::uint64_t round) {
  protocol::round_start_desc info;
  info.round = round;
  return protocol::make_round_start(info);
}

// A GlobalWeights message of `floats` f32 values, labelled `round`.
message_builder weights(std::uint64_t round, const std::vector<float>& data) {
  protocol::global_weights_desc info;
  info.round = round;
  info.n_blocks = 1;
  return protocol::make_global_weights(info, data, {});
}

}  // namespace

TEST_CASE("messages posted from two threads all arrive, each thread's in its order") {
  io_thread rt;
  listener lis(rt.executor(), tls_context(pki().server()), loopback());
  connect_options co;
  co.channel.max_bytes_in_flight = 4 << 10;  // small: the posters also wait for the writer
  auto p = rt.run(open_pair(lis, tls_context(pki().device()), co));
  constexpr std::uint64_t n = 2000;
  constexpr std::uint64_t tag = 1'000'000;  // round = thread * tag + i
  std::atomic<int> refused{0};
  auto poster = [&](std::uint64_t thread) {
    for (std::uint64_t i = 0; i < n; ++i)
      if (!p.client.post(round_start(thread * tag + i))) ++refused;
  };
  std::thread a(poster, 1);
  std::thread b(poster, 2);
  const auto received = rt.run([&]() -> asio::awaitable<std::vector<std::uint64_t>> {
    std::vector<std::uint64_t> rounds;
    for (std::uint64_t i = 0; i < 2 * n; ++i) {
      auto got = co_await p.server.receive();
      if (!got) break;
      rounds.push_back(got->as<wire::RoundStart>()->round());
    }
    co_return rounds;
  }());
  a.join();
  b.join();
  CHECK(refused == 0);
  REQUIRE(received.size() == 2 * n);
  std::uint64_t next[3] = {0, 0, 0};
  bool in_order = true;
  for (const std::uint64_t r : received) {
    const std::uint64_t thread = r / tag;
    REQUIRE((thread == 1 || thread == 2));
    in_order = in_order && r % tag == next[thread];
    ++next[thread];
  }
  CHECK(in_order);
  CHECK(next[1] == n);
  CHECK(next[2] == n);
  CHECK(p.client.stats().messages_sent == 2 * n);
}

TEST_CASE("a poster on another thread waits while the peer does not read, and goes on when it reads") {
  io_thread rt;
  listener_options lo;
  lo.channel.max_inbox_bytes = 1 << 20;
  listener lis(rt.executor(), tls_context(pki().server()), loopback(), lo);
  connect_options co;
  constexpr std::size_t bound = 2 << 20;
  co.channel.max_bytes_in_flight = bound;
  auto p = rt.run(open_pair(lis, tls_context(pki().device()), co));

  // 64 MiB in all: far more than the bound plus both sockets' buffers.
  constexpr int n = 64;
  const auto data = ramp(256 << 10, 0.f);  // 1 MiB
  std::atomic<int> attempted{0};
  std::atomic<int> posted{0};
  std::atomic<int> refused{0};
  std::thread poster([&] {
    for (int i = 0; i < n; ++i) {
      ++attempted;
      if (!p.client.post(weights(static_cast<std::uint64_t>(i), data))) ++refused;
      ++posted;
    }
  });
  // Blocked: one post under way that has not returned for a while.
  bool blocked = false;
  const auto end = std::chrono::steady_clock::now() + 30s;
  while (!blocked && std::chrono::steady_clock::now() < end) {
    const int before = posted.load();
    std::this_thread::sleep_for(300ms);
    blocked = posted.load() == before && attempted.load() == before + 1;
  }
  CHECK(blocked);
  CHECK(posted.load() < n);
  const auto in_flight = p.client.stats().bytes_in_flight;
  CHECK(in_flight > 0);
  CHECK(in_flight <= bound);

  // The peer reads: every message arrives, in order, and the poster finishes.
  rt.run([&]() -> asio::awaitable<void> {
    for (int i = 0; i < n; ++i) {
      auto got = co_await p.server.receive();
      REQUIRE_MESSAGE(got.ok(), why(got));
      REQUIRE(got->as<wire::GlobalWeights>()->round() == static_cast<std::uint64_t>(i));
    }
  }());
  poster.join();
  CHECK(posted == n);
  CHECK(refused == 0);
}

TEST_CASE("post on a closed channel returns false at once") {
  io_thread rt;
  listener lis(rt.executor(), tls_context(pki().server()), loopback());
  connect_options co;
  co.channel.max_bytes_in_flight = 4 << 10;
  co.channel.limits.max_frame_bytes = 64 << 10;
  auto p = rt.run(open_pair(lis, tls_context(pki().device()), co));

  // Too large for the frame limit: refused, the channel stays open.
  const auto big = ramp(32 << 10, 0.f);  // 128 KiB
  CHECK_FALSE(p.client.post(weights(1, big)));
  CHECK(p.client.is_open());

  rt.run(p.client.close());
  REQUIRE_FALSE(p.client.is_open());
  // From another thread (which would wait for space) and from the executor.
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) CHECK_FALSE(p.client.post(round_start(static_cast<std::uint64_t>(i))));
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK_FALSE(rt.run([&]() -> asio::awaitable<bool> { co_return p.client.post(round_start(1)); }()));
  // An empty handle refuses too.
  const channel empty;
  CHECK_FALSE(empty.post(round_start(1)));
}

TEST_CASE("a poster waiting for space is released with false when the channel closes") {
  io_thread rt;
  listener_options lo;
  lo.channel.max_inbox_bytes = 1 << 20;
  listener lis(rt.executor(), tls_context(pki().server()), loopback(), lo);
  connect_options co;
  co.channel.max_bytes_in_flight = 1 << 20;
  auto p = rt.run(open_pair(lis, tls_context(pki().device()), co));
  const auto data = ramp(256 << 10, 0.f);  // 1 MiB
  std::atomic<bool> refused{false};
  std::atomic<int> posted{0};
  std::thread poster([&] {
    for (int i = 0; i < 256 && !refused; ++i) {
      if (!p.client.post(weights(static_cast<std::uint64_t>(i), data))) refused = true;
      ++posted;
    }
  });
  // Wait until the poster stalls, then drop the peer: the channel closes and the poster returns.
  bool blocked = false;
  const auto end = std::chrono::steady_clock::now() + 30s;
  while (!blocked && std::chrono::steady_clock::now() < end) {
    const int before = posted.load();
    std::this_thread::sleep_for(300ms);
    blocked = posted.load() == before;
  }
  CHECK(blocked);
  { channel dropped = std::move(p.server); }
  CHECK(eventually([&] { return refused.load(); }));
  poster.join();
  CHECK(refused);
  CHECK(eventually([&] { return !p.client.is_open(); }));
}

TEST_CASE("posting on the channel's executor never blocks, and keeps its order with send") {
  io_thread rt;
  listener_options lo;
  lo.channel.max_inbox_bytes = 256 << 10;
  listener lis(rt.executor(), tls_context(pki().server()), loopback(), lo);
  connect_options co;
  co.channel.max_bytes_in_flight = 64 << 10;
  auto p = rt.run(open_pair(lis, tls_context(pki().device()), co));
  constexpr int n = 32;
  const auto data = ramp(256 << 10, 0.f);  // 1 MiB each, 32 MiB in all, nobody reading yet
  // Were post to wait here, nothing could free space: the io thread would hang and the run
  // time out.
  const int posted = rt.run(
      [&]() -> asio::awaitable<int> {
        int k = 0;
        for (int i = 0; i < n; ++i) k += p.client.post(weights(static_cast<std::uint64_t>(i), data)) ? 1 : 0;
        co_return k;
      }(),
      20s);
  CHECK(posted == n);
  CHECK(p.client.stats().bytes_in_flight > co.channel.max_bytes_in_flight);
  // post, send (which waits for space), post: received in that order, after everything posted
  // before.
  auto sender = [&]() -> asio::awaitable<void> {
    CHECK(p.client.post(round_start(1)));
    const status st = co_await p.client.send(round_start(2));
    REQUIRE_MESSAGE(st.ok(), why(st));
    CHECK(p.client.post(round_start(3)));
  };
  auto receiver = [&]() -> asio::awaitable<void> {
    for (int i = 0; i < n; ++i) {
      auto got = co_await p.server.receive();
      REQUIRE_MESSAGE(got.ok(), why(got));
      REQUIRE(got->as<wire::GlobalWeights>() != nullptr);
      CHECK(got->as<wire::GlobalWeights>()->round() == static_cast<std::uint64_t>(i));
    }
    for (std::uint64_t r = 1; r <= 3; ++r) {
      auto got = co_await p.server.receive();
      REQUIRE_MESSAGE(got.ok(), why(got));
      REQUIRE(got->as<wire::RoundStart>() != nullptr);
      CHECK(got->as<wire::RoundStart>()->round() == r);
    }
  };
  rt.run([&]() -> asio::awaitable<void> { co_await (sender() && receiver()); }());
}
