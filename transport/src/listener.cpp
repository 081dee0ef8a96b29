// Listener: accept loop, one handshake coroutine per connection (bounded), a queue of channels.
#include "cleave/transport/listener.h"

#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <deque>

#include "channel_impl.h"
#include "cleave/transport/log.h"

namespace cleave::transport {

namespace detail {

namespace {}

class listener_impl : public std::enable_shared_from_this<listener_impl> {
 public:
  listener_impl(const asio::any_io_executor& ex, const tls_context& ctx, const asio::ip::tcp::endpoint& at,
                listener_options opts)
      : ex_(ex), ctx_(ctx), opts_(std::move(opts)), acceptor_(ex), ready_wake_(ex), slot_wake_(ex) {
    if (!ctx_.has_certificate()) throw core::error("a listener needs a TLS context with a certificate");
    asio::error_code ec;
    acceptor_.open(at.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(at, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
      throw core::error("cannot listen on " + at.address().to_string() + ":" + std::to_string(at.port()) + ": " +
                        ec.message());
    endpoint_ = acceptor_.local_endpoint();
  }

  const asio::any_io_executor& executor() const { return ex_; }

  void start() {
    // An exception escaping the accept loop (a bug) is logged and closes the listener, so that
    // accept() reports the end instead of waiting forever.
    const auto close_on = [weak = weak_from_this()](const std::string&) {
      if (auto self = weak.lock()) self->close();
    };
    asio::co_spawn(ex_, accept_loop(shared_from_this()),
                   log_failure("listener on port " + std::to_string(endpoint_.port()), close_on));
  }

  asio::awaitable<result<channel>> accept() {
    for (;;) {
      if (!ready_.empty()) {
        channel ch = std::move(ready_.front());
        ready_.pop_front();
        --pending_;
        slot_wake_.notify();
        co_return ch;
      }
      if (closed_) co_return failure(errc::closed, "listener closed");
      co_await ready_wake_.wait();
    }
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    asio::error_code ec;
    acceptor_.close(ec);
    ready_wake_.notify();
    slot_wake_.notify();
  }

  asio::ip::tcp::endpoint endpoint_;
  std::atomic<std::uint64_t> n_accepted_{0};
  std::atomic<std::uint64_t> n_refused_{0};

 private:
  asio::awaitable<void> accept_loop(std::shared_ptr<listener_impl> self) {
    while (!closed_) {
      while (pending_ >= opts_.max_pending && !closed_) co_await slot_wake_.wait();
      if (closed_) break;
      auto [ec, socket] = co_await acceptor_.async_accept(nothrow);
      if (closed_) break;
      if (ec) {
        logger()->warn("listener on port {}: accept failed: {}", endpoint_.port(), ec.message());
        continue;
      }
      ++pending_;
      // An exception escaping a handshake (a bug) refuses that connection only: its slot is freed.
      asio::co_spawn(ex_, handshake(self, std::move(socket)),
                     log_failure("TLS handshake", [self](const std::string& why) { self->refuse("?", why); }));
    }
  }

  asio::awaitable<void> handshake(std::shared_ptr<listener_impl> self, asio::ip::tcp::socket socket) {
    std::unique_ptr<tls_stream> stream;
    try {
      stream = std::make_unique<tls_stream>(std::move(socket), ctx_, tls_stream::side::server);
    } catch (const std::exception& e) {
      refuse("?", e.what());
      co_return;
    }
    stream->set_allowed_identities(opts_.allowed_identities);
    tls_stream* raw = stream.get();
    status st;
    {
      watchdog guard(ex_, opts_.handshake_timeout, [raw] { raw->close(); });
      st = co_await stream->handshake();
      if (guard.fired()) st = failure(errc::timeout, "handshake timed out");
    }
    if (!st) {
      refuse(stream->remote(), st.error().reason());
      co_return;
    }
    logger()->info("accepted {} ({}) from {}", stream->peer_identity(),
                   stream->peer_role() ? core::tier_name(*stream->peer_role()) : "no role", stream->remote());
    ++n_accepted_;
    if (closed_) {
      --pending_;
      slot_wake_.notify();
      co_return;
    }
    ready_.push_back(start_channel(std::move(stream), opts_.channel));
    ready_wake_.notify();
  }

  void refuse(const std::string& remote, const std::string& reason) {
    logger()->warn("refused connection from {}: {}", remote, reason);
    ++n_refused_;
    --pending_;
    slot_wake_.notify();
  }

  asio::any_io_executor ex_;
  tls_context ctx_;
  listener_options opts_;
  asio::ip::tcp::acceptor acceptor_;
  std::deque<channel> ready_;
  std::size_t pending_ = 0;
  bool closed_ = false;
  wakeup ready_wake_;
  wakeup slot_wake_;
};

}  // namespace detail

listener::listener(const asio::any_io_executor& ex, const tls_context& ctx, const asio::ip::tcp::endpoint& at,
                   listener_options opts)
    : impl_(std::make_shared<detail::listener_impl>(ex, ctx, at, std::move(opts))) {
  impl_->start();
}

listener::~listener() {
  if (!impl_) return;
  auto impl = std::move(impl_);
  const auto ex = impl->executor();
  asio::dispatch(ex, [impl = std::move(impl)] { impl->close(); });
}

asio::ip::tcp::endpoint listener::local_endpoint() const {
  return impl_->endpoint_;
}

asio::awaitable<result<channel>> listener::accept() {
  co_return co_await impl_->accept();
}

void listener::close() {
  if (impl_) impl_->close();
}

std::uint64_t listener::n_accepted() const {
  return impl_->n_accepted_.load();
}
std::uint64_t listener::n_refused() const {
  return impl_->n_refused_.load();
}

}  // namespace cleave::transport
