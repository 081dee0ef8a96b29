// Accepting channels: a TCP listener whose connections must complete a mutually authenticated
// TLS 1.3 handshake (and pass the optional allow-list) before the caller sees them. Refused
// connections are logged with their reason; the listener keeps serving the others.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cleave/transport/channel.h"
#include "cleave/transport/result.h"
#include "cleave/transport/tls_context.h"

namespace cleave::transport {

// Before a connection is authenticated it costs the listener a socket and a TLS state, so
// what strangers can hold is bounded: each handshake has a deadline, one address may have only
// a few in progress, and when all slots are taken the oldest handshake is cut off for the
// newcomer (a flood of idle connections cannot keep devices out).
struct listener_options {
  channel_options channel;
  std::vector<std::string> allowed_identities;        // empty: any identity the CA signed
  std::chrono::milliseconds handshake_timeout{5000};  // from TCP accept to an authenticated peer
  std::size_t max_handshakes = 1024;                  // in progress at once
  std::size_t max_handshakes_per_address = 16;        // in progress from one IP address; more are closed
  std::size_t max_unaccepted = 64;  // authenticated channels not yet taken by accept(); accepting waits above
};

namespace detail {
class listener_impl;
}

class listener {
 public:
  // Binds and listens (port 0 picks a free port). Throws core::error if the address cannot be
  // bound or the context has no certificate.
  listener(const asio::any_io_executor& ex, const tls_context& ctx, const asio::ip::tcp::endpoint& at,
           listener_options opts = {});
  ~listener();
  listener(listener&&) noexcept = default;
  listener& operator=(listener&&) noexcept = default;

  asio::ip::tcp::endpoint local_endpoint() const;
  std::uint16_t port() const { return local_endpoint().port(); }

  // The next authenticated channel; fails once the listener is closed.
  asio::awaitable<result<channel>> accept();
  // Stops accepting; channels already accepted are not affected.
  void close();

  // Thread-safe counters: authenticated channels; connections refused or cut off before that.
  std::uint64_t n_accepted() const;
  std::uint64_t n_refused() const;

 private:
  std::shared_ptr<detail::listener_impl> impl_;
};

// A TCP port free on loopback now, for a node that must be found at the same port again after a
// restart (another process may take it meanwhile). Throws core::error when none can be had.
std::uint16_t free_loopback_port();
// n distinct ports free on loopback now (picked one at a time, two may come out the same).
std::vector<std::uint16_t> free_loopback_ports(int n);

}  // namespace cleave::transport
