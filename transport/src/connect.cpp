// Client side of a channel: resolve, connect, handshake, identity check, first frame; one
// deadline over all of it.
#include "cleave/transport/connect.h"

#include <asio/connect.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include "channel_impl.h"
#include "cleave/transport/log.h"

namespace cleave::transport {

namespace {

// The caller has the reason and reports it (a node retrying summarises its attempts).
failure refused(const std::string& where, failure f) {
  logger()->debug("connection to {} failed: {}", where, f.reason());
  return f;
}

}  // namespace

asio::awaitable<result<channel>> connect(tls_context ctx, std::string host, std::uint16_t port) {
  connect_options opts;
  co_return co_await connect(std::move(ctx), std::move(host), port, opts);
}

asio::awaitable<result<channel>> connect(tls_context ctx, std::string host, std::uint16_t port, connect_options opts) {
  const auto ex = co_await asio::this_coro::executor;
  const std::string where = host + ":" + std::to_string(port);
  const auto deadline = detail::clock::now() + opts.timeout;
  const auto left = [&] { return deadline - detail::clock::now(); };

  asio::ip::tcp::resolver resolver(ex);
  asio::ip::tcp::socket socket(ex);
  {
    detail::watchdog guard(ex, left(), [&resolver, &socket] {
      resolver.cancel();
      asio::error_code ec;
      socket.close(ec);
    });
    auto [rec, endpoints] = co_await resolver.async_resolve(host, std::to_string(port), detail::nothrow);
    if (rec) {
      co_return refused(where, failure(guard.fired() ? errc::timeout : errc::connection,
                                       "cannot resolve " + host + ": " + rec.message()));
    }
    auto [cec, ep] = co_await asio::async_connect(socket, endpoints, detail::nothrow);
    if (cec || guard.fired()) {
      co_return refused(where, failure(guard.fired() ? errc::timeout : errc::connection,
                                       "cannot connect to " + where + ": " +
                                           (guard.fired() ? std::string("timed out") : cec.message())));
    }
  }

  std::unique_ptr<tls_stream> stream;
  try {
    stream = std::make_unique<tls_stream>(std::move(socket), ctx, tls_stream::side::client);
  } catch (const std::exception& e) {
    co_return refused(where, failure(errc::connection, e.what()));
  }
  if (opts.server_identity) stream->set_allowed_identities({*opts.server_identity});
  tls_stream* raw = stream.get();
  {
    detail::watchdog guard(ex, left(), [raw] { raw->close(); });
    status st = co_await stream->handshake();
    if (guard.fired()) st = failure(errc::timeout, "TLS handshake timed out");
    if (!st) co_return refused(where, st.error());
  }

  auto impl = std::make_shared<detail::channel_impl>(std::move(stream), opts.channel);
  impl->start();
  {
    std::weak_ptr<detail::channel_impl> weak = impl;
    detail::watchdog guard(ex, left(), [weak] {
      if (auto c = weak.lock()) c->abort(errc::timeout, "no frame from the server before the connect timeout");
    });
    status st = co_await impl->wait_first_frame();
    if (!st) {
      const auto& f = st.error();
      // A TLS alert right after the handshake: the server refused this node's certificate.
      if (f.code() == errc::refused || f.code() == errc::closed || f.code() == errc::connection)
        co_return refused(where, failure(errc::refused, "server refused the connection: " + f.reason()));
      co_return refused(where, f);
    }
  }
  logger()->debug("connected to {} ({}) at {}", impl->peer_identity(),
                  impl->peer_role() ? core::tier_name(*impl->peer_role()) : "no role", where);
  co_return channel(std::move(impl));
}

}  // namespace cleave::transport
