// SIGPIPE never kills a process: peers that reset the connection during the handshake or while
// a channel writes. Each case runs in a forked child with SIGPIPE at its default disposition, so a
// write that raised it shows as the child dying from the signal.
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/ip/tcp.hpp>
#include <asio/this_coro.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cleave/protocol/protocol.h"
#include "cleave/transport/channel.h"
#include "cleave/transport/connect.h"
#include "cleave/transport/listener.h"
#include "cleave/transport/tls_stream.h"
#include "test_support.h"

using namespace cleave;
using namespace cleave::transport;
using namespace cleave::transport::testing;
using namespace std::chrono_literals;

namespace {

// Exit codes of the child: 0 passed, others name the check that failed.
enum child_exit : int { passed = 0, check_failed = 1, threw = 2, timed_out = 3 };

struct child_status {
  bool signaled = false;
  int signal = 0;
  int exit_code = -1;
};

// Runs `body` in a forked child with SIGPIPE at its default disposition and waits (bounded) for
// it. The child leaves with _exit: static destructors (the shared test PKI) stay the parent's.
child_status run_in_child(const std::function<int()>& body, std::chrono::seconds limit = 60s) {
  (void)pki();  // provisioned once, by the parent
  // The child's log lines flush stdio: it must not inherit the parent's unwritten output.
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
    int rc = threw;
    try {
      rc = body();
    } catch (...) {
      rc = threw;
    }
    ::_exit(rc);
  }
  const auto end = std::chrono::steady_clock::now() + limit;
  int st = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() > end) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return child_status{false, 0, timed_out};
    }
    std::this_thread::sleep_for(10ms);
  }
  child_status s;
  s.signaled = WIFSIGNALED(st);
  s.signal = s.signaled ? WTERMSIG(st) : 0;
  s.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return s;
}

void check_child(const child_status& s) {
  CHECK_MESSAGE(!s.signaled, "the child died from signal ", s.signal, " (", std::string(::strsignal(s.signal)), ")");
  CHECK_MESSAGE(s.exit_code == passed, "the child exited with ", s.exit_code);
}

// A TLS 1.3 ClientHello as `ctx` would send it (through memory BIOs, no socket).
std::vector<char> client_hello(const tls_context& ctx) {
  SSL* ssl = SSL_new(ctx.native());
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  SSL_set_bio(ssl, in, out);
  SSL_set_connect_state(ssl);
  (void)SSL_do_handshake(ssl);  // wants to read the ServerHello
  char* data = nullptr;
  const long n = BIO_get_mem_data(out, &data);
  std::vector<char> hello(data, data + (n > 0 ? n : 0));
  SSL_free(ssl);
  return hello;
}

// Connects (blocking), sends `bytes` and closes: with `reset`, at once with an RST (linger 0).
bool send_and_close(std::uint16_t port, const std::vector<char>& bytes, bool reset) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(port);
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&at), sizeof at) == 0;
  if (ok) ok = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  if (reset) {
    const linger l{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  ::close(fd);
  return ok;
}

}  // namespace

TEST_CASE("a listener whose clients send a ClientHello and vanish keeps serving, without SIGPIPE") {
  check_child(run_in_child([] {
    io_thread rt;
    listener lis(rt.executor(), tls_context(pki().server()), {asio::ip::make_address("127.0.0.1"), 0});
    const tls_context device_ctx(pki().device());
    const auto hello = client_hello(device_ctx);
    if (hello.empty()) return int(check_failed);
    constexpr int n = 20;
    for (int i = 0; i < n; ++i) {
      if (!send_and_close(lis.port(), hello, i % 2 == 1)) return int(check_failed);
      // Let the server answer the hello before the next one: its writes then meet the reset.
      std::this_thread::sleep_for(20ms);
    }
    if (!eventually([&] { return lis.n_refused() == n; })) return int(check_failed);
    const bool served = rt.run([&]() -> asio::awaitable<bool> {
      auto c = co_await connect(device_ctx, "127.0.0.1", lis.port());
      if (!c) co_return false;
      auto s = co_await lis.accept();
      if (!s) co_return false;
      protocol::round_start_desc info;
      info.round = 7;
      if (!(co_await c->send(protocol::make_round_start(info))).ok()) co_return false;
      auto got = co_await s->receive();
      co_return got.ok() && got->as<wire::RoundStart>() != nullptr && got->as<wire::RoundStart>()->round() == 7;
    }());
    return served ? int(passed) : int(check_failed);
  }));
}

TEST_CASE("a channel writing to a peer that reset the connection fails with an error, without SIGPIPE") {
  check_child(run_in_child([] {
    io_thread rt;
    listener_options lo;
    lo.channel.heartbeat = 0ms;
    lo.channel.idle_timeout = 0ms;
    lo.channel.max_inbox_bytes = 64 << 10;  // the reader stops reading once the peer sent this much
    listener lis(rt.executor(), tls_context(pki().server()), {asio::ip::make_address("127.0.0.1"), 0}, lo);
    const tls_context device_ctx(pki().device());
    const bool ok = rt.run([&]() -> asio::awaitable<bool> {
      auto ex = co_await asio::this_coro::executor;
      asio::ip::tcp::socket socket(ex);
      co_await socket.async_connect({asio::ip::make_address("127.0.0.1"), lis.port()}, asio::use_awaitable);
      tls_stream peer(std::move(socket), device_ctx, tls_stream::side::client);
      if (!(co_await peer.handshake()).ok()) co_return false;
      auto ch = co_await lis.accept();
      if (!ch) co_return false;

      // The peer fills the channel's inbox (so the channel stops reading and cannot see the
      // close), sends its FIN, then resets: a socket in CLOSE_WAIT that receives an RST fails
      // its next write with EPIPE, which write(2) turns into SIGPIPE.
      const std::vector<float> data(64 << 10);
      for (int i = 0; i < 4; ++i) {
        protocol::global_weights_desc info;
        info.round = static_cast<std::uint64_t>(i);
        info.n_blocks = 1;
        auto b = protocol::make_global_weights(info, data, {});
        if (!(co_await peer.write_all(b.frame())).ok()) co_return false;
      }
      co_await sleep_for(100ms);
      asio::error_code ec;
      peer.socket().shutdown(asio::socket_base::shutdown_send, ec);
      co_await sleep_for(100ms);
      peer.socket().set_option(asio::socket_base::linger(true, 0), ec);
      peer.socket().close(ec);
      co_await sleep_for(100ms);

      // Enough to need several writes.
      const std::vector<float> big(256 << 10);
      for (int i = 0; i < 8 && ch->is_open(); ++i) {
        protocol::global_weights_desc info;
        info.round = static_cast<std::uint64_t>(i);
        info.n_blocks = 1;
        (void)co_await ch->send(protocol::make_global_weights(info, big, {}));
        co_await sleep_for(10ms);
      }
      for (int i = 0; i < 200 && ch->is_open(); ++i) co_await sleep_for(10ms);
      co_return !ch->is_open() && ch->close_reason().find("write") != std::string::npos;
    }());
    return ok ? int(passed) : int(check_failed);
  }));
}
