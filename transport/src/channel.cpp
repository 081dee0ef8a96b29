// Channels: framed, verified messages over a TLS stream with backpressure, heartbeats, idle
// timeout, emulation and a clean close in both directions.
#include "cleave/transport/channel.h"

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/require.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <cstring>

#include "channel_impl.h"
#include "cleave/transport/log.h"

namespace cleave::transport {

namespace detail {

namespace {

std::string peer_label(const tls_stream& s) {
  return (s.peer_identity().empty() ? std::string("?") : s.peer_identity()) + "@" + s.remote();
}

// Whether the calling thread runs the io_context behind `ex` (for a strand: behind its inner
// executor). An executor of another kind cannot be asked: then true, so post() never blocks
// there, and backpressure comes from send() alone.
bool runs_io_of(const asio::any_io_executor& ex) {
  using io_executor = asio::io_context::executor_type;
  using tracked_io_executor =
      std::decay_t<decltype(asio::require(std::declval<io_executor>(), asio::execution::outstanding_work.tracked))>;
  if (const auto* e = ex.target<io_executor>()) return e->running_in_this_thread();
  if (const auto* e = ex.target<tracked_io_executor>()) return e->running_in_this_thread();
  if (const auto* e = ex.target<asio::strand<io_executor>>()) return e->get_inner_executor().running_in_this_thread();
  if (const auto* e = ex.target<asio::strand<asio::any_io_executor>>()) return runs_io_of(e->get_inner_executor());
  return true;
}

}  // namespace

asio::awaitable<void> wakeup::wait() {
  co_await timer_.async_wait(nothrow);
}

watchdog::watchdog(const asio::any_io_executor& ex, clock::duration after, std::function<void()> fn)
    : timer_(ex), state_(std::make_shared<state>()) {
  timer_.expires_after(after);
  timer_.async_wait([st = state_, fn = std::move(fn)](const asio::error_code& ec) {
    if (ec || !st->armed) return;
    st->fired = true;
    fn();
  });
}

void watchdog::disarm() {
  state_->armed = false;
  timer_.cancel();
}

channel_impl::channel_impl(std::unique_ptr<tls_stream> stream, const channel_options& opts)
    : stream_(std::move(stream)),
      ex_(stream_->socket().get_executor()),
      opts_(opts),
      emulator_(opts.emulation),
      writer_wake_(ex_),
      space_wake_(ex_),
      inbox_wake_(ex_),
      inbox_space_wake_(ex_),
      state_wake_(ex_),
      writer_timer_(ex_),
      heartbeat_timer_(ex_),
      last_rx_(clock::now()),
      last_big_send_(clock::now()) {}

channel_impl::~channel_impl() = default;

void channel_impl::start() {
  // The first Ping tells a TLS 1.3 client that the server accepted its certificate.
  queue_ping();
  // An exception escaping a coroutine (a bug, an allocation failure) ends this channel only:
  // it is logged and the channel aborted with it as the reason (the handler runs on ex_).
  const auto close_on = [weak = weak_from_this()](const std::string& why) {
    if (auto self = weak.lock()) self->abort(errc::connection, why);
  };
  asio::co_spawn(ex_, reader(shared_from_this()), log_failure("channel reader", close_on));
  asio::co_spawn(ex_, writer(shared_from_this()), log_failure("channel writer", close_on));
  if (opts_.heartbeat.count() > 0 || opts_.idle_timeout.count() > 0)
    asio::co_spawn(ex_, heartbeat(shared_from_this()), log_failure("channel heartbeat", close_on));
}

void channel_impl::set_reason(errc code, const std::string& reason) {
  std::lock_guard lock(reason_mu_);
  if (!close_reason_.empty()) return;
  close_reason_ = reason;
  close_code_ = code;
}

std::string channel_impl::close_reason() const {
  std::lock_guard lock(reason_mu_);
  return open_.load() ? std::string() : close_reason_;
}

void channel_impl::wake_all() {
  writer_wake_.notify();
  space_wake_.notify();
  inbox_wake_.notify();
  inbox_space_wake_.notify();
  state_wake_.notify();
  writer_timer_.cancel();
  heartbeat_timer_.cancel();
}

void channel_impl::begin_close(const std::string& reason) {
  if (closing_ || closed_) return;
  closing_ = true;
  stop_accepting();
  set_reason(errc::closed, reason);
  auto weak = weak_from_this();
  close_watchdog_ = std::make_unique<watchdog>(ex_, opts_.close_timeout, [weak] {
    if (auto self = weak.lock()) self->abort(errc::timeout, "clean close timed out");
  });
  wake_all();
}

void channel_impl::abort(errc code, const std::string& reason) {
  if (closed_) return;
  set_reason(code, reason);
  finish();
}

void channel_impl::maybe_finish() {
  if (reader_done_ && writer_done_) finish();
}

void channel_impl::finish() {
  if (closed_) return;
  closed_ = true;
  closing_ = true;
  stream_->close();
  if (close_watchdog_) close_watchdog_->disarm();
  // Nothing queued will be written now: free it, and release blocked posters.
  std::deque<outgoing> dropped;
  {
    std::lock_guard lock(data_mu_);
    accepting_ = false;
    for (const auto& o : data_q_) bytes_queued_ -= o.buf.size();
    dropped.swap(data_q_);
    bytes_in_flight_.store(bytes_queued_);
  }
  space_cv_.notify_all();
  std::string reason;
  errc code;
  {
    std::lock_guard lock(reason_mu_);
    reason = close_reason_;
    code = close_code_;
  }
  open_.store(false);
  // An operator's request answered is routine; the links of the federation are worth a line.
  const bool admin = stream_->peer_role() == core::tier::admin;
  const auto level = code != errc::closed ? spdlog::level::warn : admin ? spdlog::level::debug : spdlog::level::info;
  logger()->log(level, "channel {} closed: {} (sent {} msgs / {} B, received {} msgs / {} B)", peer_label(*stream_),
                reason, messages_sent_.load(), bytes_sent_.load(), messages_received_.load(), bytes_received_.load());
  wake_all();
}

std::optional<failure> channel_impl::check_frame_size(std::size_t size) const {
  if (size >= frame_header_bytes && size - frame_header_bytes <= opts_.limits.max_frame_bytes) return std::nullopt;
  return failure(errc::too_large, "message of " + std::to_string(size) + " bytes exceeds the frame limit of " +
                                      std::to_string(opts_.limits.max_frame_bytes) + " bytes");
}

void channel_impl::push_data(flatbuffers::DetachedBuffer frame) {
  const std::size_t size = frame.size();
  data_q_.push_back(outgoing{std::move(frame), clock::now()});
  bytes_queued_ += size;
  bytes_in_flight_.store(bytes_queued_);
}

failure channel_impl::closed_failure() const {
  std::lock_guard lock(reason_mu_);
  // An empty reason: the handle was dropped and the close has not run yet.
  return failure(close_code_, "channel closed: " + (close_reason_.empty() ? "released" : close_reason_));
}

asio::awaitable<status> channel_impl::send(flatbuffers::DetachedBuffer frame) {
  const std::size_t size = frame.size();
  if (closing_ || closed_) co_return closed_failure();
  if (auto too_large = check_frame_size(size)) co_return *too_large;
  for (;;) {
    bool queued = false;
    bool refused = closing_ || closed_;
    if (!refused) {
      std::lock_guard lock(data_mu_);
      refused = !accepting_;
      if (!refused && fits(size)) {
        push_data(std::move(frame));
        queued = true;
      }
    }
    if (refused) co_return closed_failure();
    if (queued) break;
    co_await space_wake_.wait();  // woken as the writer frees space, and by every close
  }
  writer_wake_.notify();
  co_return status{};
}

bool channel_impl::on_io_thread() const {
  return runs_io_of(ex_);
}

bool channel_impl::post(flatbuffers::DetachedBuffer frame) {
  const std::size_t size = frame.size();
  if (check_frame_size(size)) return false;
  // A thread of the channel's io_context must not wait: the writer that would free the space
  // may need that very thread. It may go over the bound instead.
  const bool may_block = !on_io_thread();
  {
    std::unique_lock lock(data_mu_);
    if (may_block) space_cv_.wait(lock, [&] { return !accepting_ || fits(size); });
    if (!accepting_) return false;
    push_data(std::move(frame));
  }
  wake_writer_from_any_thread();
  return true;
}

void channel_impl::wake_writer_from_any_thread() {
  // The wakeup timer is not thread-safe: notify on the executor (inline when already there).
  // One pending wakeup serves every message queued before it runs.
  if (writer_wake_posted_.exchange(true)) return;
  asio::dispatch(ex_, [self = shared_from_this()] {
    self->writer_wake_posted_.exchange(false);
    self->writer_wake_.notify();
  });
}

void channel_impl::stop_accepting() {
  {
    std::lock_guard lock(data_mu_);
    accepting_ = false;
  }
  space_cv_.notify_all();
}

std::size_t channel_impl::queued_messages() const {
  std::lock_guard lock(data_mu_);
  return data_q_.size();
}

void channel_impl::queue_control(message_builder&& m) {
  control_q_.push_back(outgoing{m.release(), clock::now()});
  writer_wake_.notify();
}

void channel_impl::queue_ping(std::size_t padding) {
  const std::uint64_t seq = ++ping_sequence_;
  const std::uint64_t sent = now_ns();
  recent_pings_[seq % recent_pings_.size()] = {seq, sent};
  queue_control(make_ping(seq, sent, padding));
  ++pings_queued_;
}

asio::awaitable<result<message>> channel_impl::receive() {
  for (;;) {
    if (!inbox_.empty()) {
      message m = std::move(inbox_.front());
      inbox_.pop_front();
      inbox_bytes_ -= m.frame_bytes();
      inbox_space_wake_.notify();
      co_return m;
    }
    if (closed_ || reader_done_) {
      std::lock_guard lock(reason_mu_);
      co_return failure(close_code_, close_reason_.empty() ? std::string("channel closed") : close_reason_);
    }
    co_await inbox_wake_.wait();
  }
}

asio::awaitable<void> channel_impl::close() {
  begin_close("closed locally");
  while (!closed_) co_await state_wake_.wait();
}

asio::awaitable<status> channel_impl::wait_first_frame() {
  while (!got_first_frame_ && !closed_ && !reader_done_) co_await state_wake_.wait();
  if (got_first_frame_) co_return status{};
  std::lock_guard lock(reason_mu_);
  co_return failure(close_code_, close_reason_);
}

channel_stats channel_impl::stats() const {
  channel_stats s;
  s.bytes_sent = bytes_sent_.load();
  s.bytes_received = bytes_received_.load();
  s.messages_sent = messages_sent_.load();
  s.messages_received = messages_received_.load();
  s.bytes_in_flight = bytes_in_flight_.load();
  s.rtt_us = rtt_us_.load();
  s.last_rtt_us = last_rtt_us_.load();
  s.base_rtt_us = base_rtt_us_.load();
  s.send_bytes_per_second = send_bps_.value();
  s.receive_bytes_per_second = receive_bps_.value();
  return s;
}

}  // namespace detail

// ---- channel handle ----

channel::channel(std::shared_ptr<detail::channel_impl> impl) : impl_(std::move(impl)) {}

channel::~channel() {
  if (!impl_) return;
  auto impl = std::move(impl_);
  // Refused from here on (a poster blocked on this channel is released now), even before the
  // close runs on the executor.
  impl->stop_accepting();
  const auto ex = impl->executor();
  asio::dispatch(ex, [impl = std::move(impl)] { impl->begin_close("channel released"); });
}

channel& channel::operator=(channel&& other) noexcept {
  if (this != &other) {
    channel old(std::move(impl_));
    impl_ = std::move(other.impl_);
  }
  return *this;
}

asio::awaitable<status> channel::send(message_builder&& m) {
  CLEAVE_ASSERT(impl_, "send on an empty channel");
  flatbuffers::DetachedBuffer frame = m.release();
  co_return co_await impl_->send(std::move(frame));
}

bool channel::post(message_builder&& m) const {
  // A copy: a poster that waits keeps the channel alive even if the handle is dropped meanwhile.
  const auto impl = impl_;
  if (!impl) return false;
  return impl->post(m.release());
}

asio::awaitable<result<message>> channel::receive() {
  CLEAVE_ASSERT(impl_, "receive on an empty channel");
  co_return co_await impl_->receive();
}

asio::awaitable<void> channel::close() {
  if (!impl_) co_return;
  co_await impl_->close();
}

bool channel::is_open() const {
  return impl_ && impl_->is_open();
}
std::string channel::close_reason() const {
  return impl_ ? impl_->close_reason() : std::string("no channel");
}
const std::string& channel::peer_identity() const {
  return impl_->peer_identity();
}
std::optional<core::tier> channel::peer_role() const {
  return impl_->peer_role();
}
std::optional<std::uint32_t> channel::peer_node_id() const {
  return impl_->peer_node_id();
}
const std::string& channel::peer_serial() const {
  return impl_->peer_serial();
}
const std::string& channel::remote() const {
  return impl_->remote();
}
channel_stats channel::stats() const {
  return impl_ ? impl_->stats() : channel_stats{};
}
void channel::emulate(const link_caps& caps) {
  impl_->emulate(caps);
}
asio::any_io_executor channel::get_executor() const {
  return impl_->executor();
}

channel start_channel(std::unique_ptr<tls_stream> stream, const channel_options& opts) {
  auto impl = std::make_shared<detail::channel_impl>(std::move(stream), opts);
  impl->start();
  return channel(std::move(impl));
}

}  // namespace cleave::transport
