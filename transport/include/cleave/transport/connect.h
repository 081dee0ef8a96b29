// Opening a channel to a listener: TCP connect, TLS 1.3 handshake with this node's certificate,
// check of the server's identity, and a wait for the server's first frame (with TLS 1.3 that is
// when a refused client certificate shows up).
#pragma once

#include <asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "cleave/transport/channel.h"
#include "cleave/transport/result.h"
#include "cleave/transport/tls_context.h"

namespace cleave::transport {

struct connect_options {
  channel_options channel;
  std::optional<std::string> server_identity;  // required server name; unset: any the CA signed
  std::chrono::milliseconds timeout{10000};    // TCP connect + handshake + first frame
};

// Runs on the calling coroutine's executor. Fails with errc::connection (unreachable),
// errc::refused (TLS or identity check failed, on either side) or errc::timeout.
// Name the options object before the co_await: g++ 12 destroys an aggregate temporary built
// inside a co_await expression twice.
asio::awaitable<result<channel>> connect(tls_context ctx, std::string host, std::uint16_t port, connect_options opts);
asio::awaitable<result<channel>> connect(tls_context ctx, std::string host, std::uint16_t port);

}  // namespace cleave::transport
