// Listener: accept loop, one handshake coroutine per connection (bounded), a queue of channels.
#include "cleave/transport/listener.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cerrno>
#include <deque>
#include <list>
#include <unordered_map>
#include <vector>

#include "channel_impl.h"
#include "cleave/transport/log.h"

namespace cleave::transport {

namespace detail {

namespace {

// Refusals before authentication come in floods: the first few of each second are logged, the
// rest counted and summed up in one line when the second is over.
class refusal_log {
 public:
  explicit refusal_log(const asio::any_io_executor& ex) : timer_(ex) {}

  void note(std::uint16_t port, const std::string& remote, const std::string& reason) {
    const auto now = clock::now();
    if (now - window_ >= std::chrono::seconds(1)) {
      flush(port);
      window_ = now;
      logged_ = 0;
    }
    if (logged_ < per_second) {
      ++logged_;
      logger()->warn("refused connection from {}: {}", remote, reason);
      return;
    }
    if (suppressed_++ == 0) {
      timer_.expires_at(window_ + std::chrono::seconds(1));
      timer_.async_wait([this, port](const asio::error_code& ec) {
        if (!ec) flush(port);
      });
    }
  }

  void flush(std::uint16_t port) {
    if (suppressed_ == 0) return;
    logger()->warn("listener on port {}: {} more connections refused in the last second (not logged one by one)", port,
                   suppressed_);
    suppressed_ = 0;
  }

  void cancel() { timer_.cancel(); }

 private:
  static constexpr int per_second = 5;
  asio::steady_timer timer_;
  clock::time_point window_{};
  int logged_ = 0;
  std::uint64_t suppressed_ = 0;
};

bool out_of_descriptors(const asio::error_code& ec) {
  return ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space || ec == asio::error::no_memory ||
         ec.value() == ENFILE;
}

}  // namespace

class listener_impl : public std::enable_shared_from_this<listener_impl> {
 public:
  listener_impl(const asio::any_io_executor& ex, const tls_context& ctx, const asio::ip::tcp::endpoint& at,
                listener_options opts)
      : ex_(ex),
        ctx_(ctx),
        opts_(std::move(opts)),
        acceptor_(ex),
        ready_wake_(ex),
        slot_wake_(ex),
        backoff_(ex),
        refusals_(ex) {
    if (!ctx_.has_certificate()) throw core::error("a listener needs a TLS context with a certificate");
    if (opts_.max_handshakes == 0 || opts_.max_handshakes_per_address == 0 || opts_.max_unaccepted == 0)
      throw core::error("listener limits must be > 0");
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
    backoff_.cancel();
    refusals_.flush(endpoint_.port());
    refusals_.cancel();
    for (auto& h : handshakes_) h.stream->close();
    ready_wake_.notify();
    slot_wake_.notify();
  }

  asio::ip::tcp::endpoint endpoint_;
  std::atomic<std::uint64_t> n_accepted_{0};
  std::atomic<std::uint64_t> n_refused_{0};

 private:
  struct handshake_slot {
    std::string address;
    tls_stream* stream = nullptr;
    bool cut_off = false;
    const char* reason = "";
  };

  // Handshakes at once that make a flood (honest fleets reconnect a few at a time).
  static constexpr std::size_t flood_handshakes = 32;

  // A handshake's place in the slots for as long as it runs, however it ends.
  class slot_lease {
   public:
    slot_lease(listener_impl& l, std::string address, tls_stream* stream) : l_(l) {
      ++l_.per_address_[address];
      it_ = l_.handshakes_.insert(l_.handshakes_.end(), handshake_slot{std::move(address), stream});
      l_.most_handshakes_ = std::max(l_.most_handshakes_, l_.handshakes_.size());
    }
    ~slot_lease() {
      auto n = l_.per_address_.find(it_->address);
      if (n != l_.per_address_.end() && --n->second == 0) l_.per_address_.erase(n);
      l_.handshakes_.erase(it_);
      if (l_.handshakes_.empty() && l_.most_handshakes_ >= flood_handshakes) {
        // A flood of handshakes is over: the buffers it took go back to the system, not only to
        // the allocator's free lists (where they would stay for good). Once this handshake's
        // stream is gone too.
        l_.most_handshakes_ = 0;
#if defined(__GLIBC__)
        asio::post(l_.ex_, [] { ::malloc_trim(0); });
#endif
      }
    }
    slot_lease(const slot_lease&) = delete;
    slot_lease& operator=(const slot_lease&) = delete;
    const handshake_slot& slot() const { return *it_; }

   private:
    listener_impl& l_;
    std::list<handshake_slot>::iterator it_;
  };

  asio::awaitable<void> accept_loop(std::shared_ptr<listener_impl> self) {
    while (!closed_) {
      while (ready_.size() >= opts_.max_unaccepted && !closed_) co_await slot_wake_.wait();
      if (closed_) break;
      auto [ec, socket] = co_await acceptor_.async_accept(nothrow);
      if (closed_) break;
      if (ec) {
        co_await accept_failed(ec);
        continue;
      }
      asio::error_code aec;
      const auto peer = socket.remote_endpoint(aec);
      std::string address = aec ? std::string("?") : peer.address().to_string();
      if (const auto n = per_address_.find(address);
          n != per_address_.end() && n->second >= opts_.max_handshakes_per_address) {
        refuse(address + ":" + std::to_string(peer.port()),
               std::to_string(n->second) + " handshakes from that address already in progress");
        continue;  // the socket closes here
      }
      if (handshakes_.size() >= opts_.max_handshakes) cut_off_oldest("all handshake slots taken");
      // An exception escaping a handshake (a bug) refuses that connection only.
      asio::co_spawn(ex_, handshake(self, std::move(socket), std::move(address)),
                     log_failure("TLS handshake", [self](const std::string& why) { self->refuse("?", why); }));
    }
  }

  // Out of descriptors: the oldest handshake makes room, and accepting pauses a moment so the
  // loop does not spin on an error it cannot clear.
  asio::awaitable<void> accept_failed(const asio::error_code& ec) {
    if (!out_of_descriptors(ec)) {
      logger()->warn("listener on port {}: accept failed: {}", endpoint_.port(), ec.message());
      co_return;
    }
    refusals_.note(endpoint_.port(), "?", "cannot accept: " + ec.message());
    cut_off_oldest("out of file descriptors");
    backoff_.expires_after(std::chrono::milliseconds(50));
    co_await backoff_.async_wait(nothrow);
  }

  void cut_off_oldest(const char* why) {
    for (auto& h : handshakes_)
      if (!h.cut_off) {
        h.cut_off = true;
        h.reason = why;
        h.stream->close();
        return;
      }
  }

  asio::awaitable<void> handshake(std::shared_ptr<listener_impl> self, asio::ip::tcp::socket socket,
                                  std::string address) {
    std::unique_ptr<tls_stream> stream;
    try {
      stream = std::make_unique<tls_stream>(std::move(socket), ctx_, tls_stream::side::server);
    } catch (const std::exception& e) {
      refuse(address, e.what());
      co_return;
    }
    stream->set_allowed_identities(opts_.allowed_identities);
    tls_stream* raw = stream.get();
    status st;
    {
      slot_lease lease(*this, std::move(address), raw);
      watchdog guard(ex_, opts_.handshake_timeout, [raw] { raw->close(); });
      st = co_await stream->handshake();
      if (lease.slot().cut_off)
        st = failure(errc::closed, std::string("cut off before authentication: ") + lease.slot().reason);
      else if (guard.fired())
        st = failure(errc::timeout, "no authenticated peer after " + std::to_string(opts_.handshake_timeout.count()) +
                                        " ms (handshake timed out)");
    }
    if (!st) {
      refuse(stream->remote(), st.error().reason());
      co_return;
    }
    logger()->log(stream->peer_role() == core::tier::admin ? spdlog::level::debug : spdlog::level::info,
                  "accepted {} ({}) from {}", stream->peer_identity(),
                  stream->peer_role() ? core::tier_name(*stream->peer_role()) : "no role", stream->remote());
    ++n_accepted_;
    if (closed_) co_return;
    ready_.push_back(start_channel(std::move(stream), opts_.channel));
    ready_wake_.notify();
  }

  void refuse(const std::string& remote, const std::string& reason) {
    ++n_refused_;
    refusals_.note(endpoint_.port(), remote, reason);
  }

  asio::any_io_executor ex_;
  tls_context ctx_;
  listener_options opts_;
  asio::ip::tcp::acceptor acceptor_;
  std::deque<channel> ready_;
  std::list<handshake_slot> handshakes_;  // oldest first
  std::unordered_map<std::string, std::size_t> per_address_;
  std::size_t most_handshakes_ = 0;  // at once, since the slots were last all free
  bool closed_ = false;
  wakeup ready_wake_;
  wakeup slot_wake_;
  asio::steady_timer backoff_;
  refusal_log refusals_;
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

std::vector<std::uint16_t> free_loopback_ports(int n) {
  asio::io_context io;
  // All bound at once: the kernel cannot hand out one of them twice.
  std::vector<asio::ip::tcp::acceptor> held;
  std::vector<std::uint16_t> ports;
  for (int i = 0; i < n; ++i) {
    auto& a = held.emplace_back(io);
    asio::error_code ec;
    a.open(asio::ip::tcp::v4(), ec);
    if (!ec) a.bind({asio::ip::make_address_v4("127.0.0.1"), 0}, ec);
    if (ec) throw core::error("no free port on loopback: " + ec.message());
    ports.push_back(a.local_endpoint().port());
  }
  return ports;
}

std::uint16_t free_loopback_port() {
  return free_loopback_ports(1).front();
}

}  // namespace cleave::transport
