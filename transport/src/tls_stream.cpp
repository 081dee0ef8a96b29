// Non-blocking OpenSSL on an Asio socket: each SSL call that would block waits for readiness.
#include "cleave/transport/tls_stream.h"

#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "openssl_util.h"

namespace cleave::transport {

namespace detail {

// What the verify callback checks and why it refused; reached through SSL ex_data.
struct peer_check {
  std::vector<std::string> allowed;
  std::string reason;
};

}  // namespace detail

using namespace detail;

namespace {

constexpr auto nothrow = asio::experimental::as_tuple(asio::use_awaitable);
constexpr int write_buffer_bytes = 128 << 10;

int check_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

int verify_callback(int preverify_ok, X509_STORE_CTX* store) {
  SSL* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* check = ssl ? static_cast<peer_check*>(SSL_get_ex_data(ssl, check_index())) : nullptr;
  if (!check) return preverify_ok;
  X509* cert = X509_STORE_CTX_get_current_cert(store);
  const int depth = X509_STORE_CTX_get_error_depth(store);
  if (!preverify_ok) {
    if (check->reason.empty()) {
      const int err = X509_STORE_CTX_get_error(store);
      check->reason = "certificate '" + (cert ? common_name(cert) : std::string("?")) +
                      "' rejected: " + verify_error_text(err, cert);
      if (depth > 0) check->reason += " (chain depth " + std::to_string(depth) + ")";
    }
    return 0;
  }
  if (depth == 0 && !check->allowed.empty()) {
    const std::string name = cert ? common_name(cert) : std::string();
    if (std::find(check->allowed.begin(), check->allowed.end(), name) == check->allowed.end()) {
      if (check->reason.empty()) check->reason = "identity '" + name + "' is not on the allow-list";
      X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION);
      return 0;
    }
  }
  return 1;
}

bool is_alert(unsigned long e) {
  return ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) >= SSL_AD_REASON_OFFSET;
}

// Turns a failed SSL call into a failure, clearing the error queue.
failure ssl_failure(SSL* ssl, int ret, const char* op) {
  const int code = SSL_get_error(ssl, ret);
  const int saved_errno = errno;
  const unsigned long e = ERR_peek_error();
  std::string text;
  if (e) {
    const char* r = ERR_reason_error_string(e);
    text = r ? r : "unknown OpenSSL error";
  }
  ERR_clear_error();
  switch (code) {
    case SSL_ERROR_ZERO_RETURN:
      return failure(errc::closed, "peer closed the connection");
    case SSL_ERROR_SYSCALL:
      if (saved_errno != 0) return failure(errc::connection, std::string(op) + ": " + std::strerror(saved_errno));
      return failure(errc::connection, std::string(op) + ": connection lost");
    case SSL_ERROR_SSL:
      if (e && ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING)
        return failure(errc::connection, std::string(op) + ": connection lost without TLS close");
      if (e && is_alert(e)) return failure(errc::refused, "peer sent TLS alert: " + text);
      return failure(errc::connection, std::string(op) + ": " + (text.empty() ? "TLS error" : text));
    default:
      return failure(errc::connection, std::string(op) + ": TLS error " + std::to_string(code));
  }
}

// A socket BIO whose writes use send(MSG_NOSIGNAL). OpenSSL's socket BIO writes with write(2),
// and a write to a socket the peer reset raises SIGPIPE, which kills the process; here it fails
// with EPIPE and the stream reports a lost connection. Reads stay with OpenSSL's socket BIO (a
// read raises no signal). ctrl answers what the buffer BIO above and SSL ask a socket BIO (as
// crypto/bio/bss_sock.c does): the descriptor, the close flag, flush and dup.
int nosignal_fd(BIO* b) {
  return static_cast<int>(reinterpret_cast<std::intptr_t>(BIO_get_data(b)));
}

int nosignal_write(BIO* b, const char* data, int n) {
  errno = 0;
  const ssize_t r = ::send(nosignal_fd(b), data, static_cast<std::size_t>(n), MSG_NOSIGNAL);
  BIO_clear_retry_flags(b);
  if (r <= 0 && BIO_sock_should_retry(static_cast<int>(r))) BIO_set_retry_write(b);
  return static_cast<int>(r);
}

long nosignal_ctrl(BIO* b, int cmd, long num, void* ptr) {
  switch (cmd) {
    case BIO_C_SET_FD:
      BIO_set_data(b, reinterpret_cast<void*>(static_cast<std::intptr_t>(*static_cast<int*>(ptr))));
      BIO_set_shutdown(b, static_cast<int>(num));
      BIO_set_init(b, 1);
      return 1;
    case BIO_C_GET_FD:
      if (!BIO_get_init(b)) return -1;
      if (ptr) *static_cast<int*>(ptr) = nosignal_fd(b);
      return nosignal_fd(b);
    case BIO_CTRL_GET_CLOSE:
      return BIO_get_shutdown(b);
    case BIO_CTRL_SET_CLOSE:
      BIO_set_shutdown(b, static_cast<int>(num));
      return 1;
    case BIO_CTRL_DUP:
    case BIO_CTRL_FLUSH:
      return 1;
    default:
      return 0;  // pending bytes, kTLS and the rest: none, as for a socket BIO
  }
}

int nosignal_create(BIO* b) {
  BIO_set_data(b, nullptr);
  BIO_set_shutdown(b, BIO_NOCLOSE);
  BIO_set_init(b, 0);
  return 1;
}

int nosignal_destroy(BIO* b) {
  if (!b) return 0;
  if (BIO_get_init(b) && BIO_get_shutdown(b)) ::close(nosignal_fd(b));
  BIO_set_init(b, 0);
  return 1;
}

// Made once, never freed (BIOs of live streams use it until exit).
const BIO_METHOD* nosignal_socket_method() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR,
                                 "socket (send with MSG_NOSIGNAL)");
    CLEAVE_CHECK_SSL(m);
    CLEAVE_CHECK_SSL(BIO_meth_set_write(m, nosignal_write) == 1);
    CLEAVE_CHECK_SSL(BIO_meth_set_ctrl(m, nosignal_ctrl) == 1);
    CLEAVE_CHECK_SSL(BIO_meth_set_create(m, nosignal_create) == 1);
    CLEAVE_CHECK_SSL(BIO_meth_set_destroy(m, nosignal_destroy) == 1);
    return m;
  }();
  return method;
}

}  // namespace

tls_stream::tls_stream(asio::ip::tcp::socket socket, const tls_context& ctx, side s)
    : socket_(std::move(socket)), ctx_(ctx), check_(std::make_unique<peer_check>()) {
  asio::error_code ec;
  const auto ep = socket_.remote_endpoint(ec);
  remote_ = ec ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);
  socket_.non_blocking(true, ec);
  if (ec) throw core::error("cannot make socket non-blocking: " + ec.message());
  ssl_ = SSL_new(ctx.current().get());  // holds its own reference: a reload cannot free it
  CLEAVE_CHECK_SSL(ssl_);
  // Reads go straight to the socket (with OpenSSL's read-ahead buffer); writes go through a
  // buffer BIO so that many 16 KiB records leave in one system call (flushed by write_all), to
  // a socket BIO that never raises SIGPIPE.
  const int fd = static_cast<int>(socket_.native_handle());
  BIO* rbio = BIO_new_socket(fd, BIO_NOCLOSE);
  BIO* sock = BIO_new(nosignal_socket_method());
  BIO* buffer = BIO_new(BIO_f_buffer());
  if (!rbio || !sock || !buffer) {
    BIO_free(rbio);
    BIO_free(sock);
    BIO_free(buffer);
    throw_openssl("BIO_new", __FILE__, __LINE__);
  }
  BIO_set_fd(sock, fd, BIO_NOCLOSE);
  CLEAVE_CHECK_SSL(BIO_set_write_buffer_size(buffer, write_buffer_bytes) == 1);
  wbio_ = BIO_push(buffer, sock);
  SSL_set_bio(ssl_, rbio, wbio_);
  CLEAVE_CHECK_SSL(SSL_set_ex_data(ssl_, check_index(), check_.get()));
  SSL_set_verify(ssl_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, verify_callback);
  if (s == side::server)
    SSL_set_accept_state(ssl_);
  else
    SSL_set_connect_state(ssl_);
}

tls_stream::~tls_stream() {
  if (ssl_) SSL_free(ssl_);
}

void tls_stream::set_allowed_identities(std::vector<std::string> names) {
  check_->allowed = std::move(names);
}

asio::awaitable<status> tls_stream::flush() {
  for (;;) {
    if (!socket_.is_open()) co_return failure(errc::closed, "connection closed locally");
    if (BIO_wpending(wbio_) == 0) co_return status{};
    errno = 0;
    if (BIO_flush(wbio_) > 0) co_return status{};
    if (!BIO_should_retry(wbio_)) {
      const int err = errno;
      ERR_clear_error();
      co_return failure(errc::connection, std::string("write: ") + (err ? std::strerror(err) : "connection lost"));
    }
    auto [ec] = co_await socket_.async_wait(asio::socket_base::wait_write, nothrow);
    if (ec) co_return failure(errc::closed, "connection closed locally");
  }
}

asio::awaitable<status> tls_stream::handshake() {
  for (;;) {
    if (!socket_.is_open()) co_return failure(errc::timeout, "handshake aborted (timeout or close)");
    ERR_clear_error();
    const int r = SSL_do_handshake(ssl_);
    if (r == 1) break;
    const int code = SSL_get_error(ssl_, r);
    if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE) {
      auto [ec] = co_await socket_.async_wait(
          code == SSL_ERROR_WANT_READ ? asio::socket_base::wait_read : asio::socket_base::wait_write, nothrow);
      if (ec) co_return failure(errc::timeout, "handshake aborted (timeout or close)");
      continue;
    }
    failure f = ssl_failure(ssl_, r, "handshake failed");
    if (!check_->reason.empty()) co_return failure(errc::refused, check_->reason);
    co_return failure(errc::refused, f.reason());
  }
  if (X509* peer = SSL_get0_peer_certificate(ssl_)) {
    peer_identity_ = common_name(peer);
    peer_role_ = certificate_role(peer);
    peer_node_id_ = certificate_node_id(peer);
    peer_serial_ = serial_hex(X509_get0_serialNumber(peer));
    ctx_.note_peer(peer, remote_);
  }
  co_return co_await flush();
}

asio::awaitable<result<std::size_t>> tls_stream::read_some(std::span<std::byte> buf) {
  for (;;) {
    if (!socket_.is_open()) co_return failure(errc::closed, "connection closed locally");
    ERR_clear_error();
    errno = 0;
    std::size_t got = 0;
    const int r = SSL_read_ex(ssl_, buf.data(), buf.size(), &got);
    if (r == 1) co_return got;
    const int code = SSL_get_error(ssl_, r);
    if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE) {
      auto [ec] = co_await socket_.async_wait(
          code == SSL_ERROR_WANT_READ ? asio::socket_base::wait_read : asio::socket_base::wait_write, nothrow);
      if (ec) co_return failure(errc::closed, "connection closed locally");
      continue;
    }
    co_return ssl_failure(ssl_, r, "read");
  }
}

asio::awaitable<status> tls_stream::write_all(std::span<const std::byte> buf) {
  std::size_t done = 0;
  while (done < buf.size()) {
    if (!socket_.is_open()) co_return failure(errc::closed, "connection closed locally");
    ERR_clear_error();
    errno = 0;
    std::size_t n = 0;
    const int r = SSL_write_ex(ssl_, buf.data() + done, buf.size() - done, &n);
    if (r == 1) {
      done += n;
      continue;
    }
    const int code = SSL_get_error(ssl_, r);
    if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE) {
      auto [ec] = co_await socket_.async_wait(
          code == SSL_ERROR_WANT_READ ? asio::socket_base::wait_read : asio::socket_base::wait_write, nothrow);
      if (ec) co_return failure(errc::closed, "connection closed locally");
      continue;
    }
    co_return ssl_failure(ssl_, r, "write");
  }
  co_return co_await flush();
}

asio::awaitable<void> tls_stream::shutdown() {
  // Sending close_notify needs at most a few writable waits; the peer's reply is not awaited.
  for (int i = 0; i < 16 && socket_.is_open(); ++i) {
    ERR_clear_error();
    const int r = SSL_shutdown(ssl_);
    if (r >= 0) break;
    const int code = SSL_get_error(ssl_, r);
    if (code != SSL_ERROR_WANT_WRITE) break;
    auto [ec] = co_await socket_.async_wait(asio::socket_base::wait_write, nothrow);
    if (ec) break;
  }
  ERR_clear_error();
  co_await flush();
}

void tls_stream::close() {
  asio::error_code ec;
  socket_.shutdown(asio::socket_base::shutdown_both, ec);
  socket_.close(ec);
}

}  // namespace cleave::transport
