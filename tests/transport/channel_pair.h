// A connected pair of channels over loopback for the channel tests, and their small helpers.
#pragma once

#include <doctest/doctest.h>

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <string>
#include <vector>

#include "cleave/transport/channel.h"
#include "cleave/transport/connect.h"
#include "cleave/transport/listener.h"

namespace cleave::transport::testing {

inline asio::ip::tcp::endpoint loopback() {
  return {asio::ip::make_address("127.0.0.1"), 0};
}

template <class T>
inline std::string why(const result<T>& r) {
  return r.ok() ? std::string() : std::string(errc_name(r.error().code())) + ": " + r.error().reason();
}
inline std::string why(const status& s) {
  return s.ok() ? std::string() : std::string(errc_name(s.error().code())) + ": " + s.error().reason();
}

// A connected pair: client (device-1) and the server side of the same connection.
struct channel_pair {
  channel client;
  channel server;
};

inline asio::awaitable<channel_pair> open_pair(listener& lis, const tls_context& ctx, connect_options co) {
  auto c = co_await connect(ctx, "127.0.0.1", lis.port(), co);
  REQUIRE_MESSAGE(c.ok(), why(c));
  auto s = co_await lis.accept();
  REQUIRE_MESSAGE(s.ok(), why(s));
  channel_pair p;
  p.client = std::move(c.value());
  p.server = std::move(s.value());
  co_return p;
}

inline asio::awaitable<channel_pair> open_pair(listener& lis, const tls_context& ctx) {
  connect_options co;
  co_return co_await open_pair(lis, ctx, co);
}

inline std::vector<float> ramp(std::size_t n, float start) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

}  // namespace cleave::transport::testing
