// A TLS 1.3 stream over an Asio TCP socket: OpenSSL works on the socket directly (non-blocking,
// no memory BIO pair and its copies), driven by Asio readiness waits from C++20 coroutines.
// Lower layer of transport::channel; tests use it to play misbehaving peers.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cleave/core/tier.h"
#include "cleave/transport/result.h"
#include "cleave/transport/tls_context.h"

typedef struct ssl_st SSL;
typedef struct bio_st BIO;

namespace cleave::transport {

namespace detail {
struct peer_check;
}

class tls_stream {
 public:
  enum class side { client, server };

  // Takes a connected socket. All operations must run on the socket's executor, one read and
  // one write at a time (they may overlap each other).
  tls_stream(asio::ip::tcp::socket socket, const tls_context& ctx, side s);
  ~tls_stream();
  tls_stream(const tls_stream&) = delete;
  tls_stream& operator=(const tls_stream&) = delete;

  // Peer identities (certificate common names) accepted by the handshake; empty: any name the
  // CA signed. Set before handshake().
  void set_allowed_identities(std::vector<std::string> names);

  // Runs the TLS handshake. Fails with errc::refused and the reason (the peer's certificate
  // check, protocol version, missing certificate, identity not allowed, or the peer's alert).
  // TLS 1.3: a client whose certificate the server rejects sees success here and the
  // server's alert on its first read.
  asio::awaitable<status> handshake();

  // Reads at least one byte. Fails with errc::closed after the peer's close_notify,
  // errc::refused on a TLS alert, errc::connection when the connection breaks.
  asio::awaitable<result<std::size_t>> read_some(std::span<std::byte> buf);
  // Writes all bytes.
  asio::awaitable<status> write_all(std::span<const std::byte> buf);
  // Sends close_notify (best effort; does not wait for the peer's).
  asio::awaitable<void> shutdown();
  // Closes the socket; pending operations end with an error.
  void close();
  bool is_open() const { return socket_.is_open(); }

  const std::string& peer_identity() const { return peer_identity_; }
  std::optional<core::tier> peer_role() const { return peer_role_; }
  std::optional<std::uint32_t> peer_node_id() const { return peer_node_id_; }  // as certs.h reads it
  // The serial number of the peer's certificate, upper-case hex ("" before the handshake).
  const std::string& peer_serial() const { return peer_serial_; }
  // "address:port" of the peer, or "?" when unknown.
  const std::string& remote() const { return remote_; }
  asio::ip::tcp::socket& socket() { return socket_; }
  SSL* native() { return ssl_; }

 private:
  asio::awaitable<status> flush();

  asio::ip::tcp::socket socket_;
  tls_context ctx_;  // the node's (shared) state: peer certificates are noted there
  SSL* ssl_ = nullptr;
  BIO* wbio_ = nullptr;  // owned by ssl_
  std::unique_ptr<detail::peer_check> check_;
  std::string peer_identity_;
  std::optional<core::tier> peer_role_;
  std::optional<std::uint32_t> peer_node_id_;
  std::string peer_serial_;
  std::string remote_;
};

}  // namespace cleave::transport
