// Channels, the I/O side: the reader (frames in, Ping/Pong, the inbox), the writer (control
// frames first, emulated pacing) and the heartbeat (probes and the idle timeout).
#include <algorithm>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>
#include <cstring>

#include "channel_impl.h"

namespace cleave::transport::detail {

asio::awaitable<status> channel_impl::read_exact(std::byte* p, std::size_t n, std::size_t& done) {
  done = 0;
  while (done < n) {
    auto r = co_await stream_->read_some(std::span<std::byte>(p + done, n - done));
    if (!r) co_return r.error();
    done += *r;
    last_rx_ = clock::now();
    if (frame_due_ == clock::time_point::max() && opts_.idle_timeout.count() > 0 && opts_.min_frame_rate > 0) {
      frame_began_ = last_rx_;
      frame_due_ = last_rx_ + opts_.idle_timeout;
    }
  }
  co_return status{};
}

void channel_impl::frame_length_known(std::uint32_t len) {
  frame_len_ = len;
  if (frame_due_ == clock::time_point::max()) return;
  const double secs = static_cast<double>(frame_header_bytes + len) / opts_.min_frame_rate;
  frame_due_ = frame_began_ + opts_.idle_timeout +
               std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(secs));
  if (opts_.max_frame_time.count() > 0) frame_due_ = std::min(frame_due_, frame_began_ + opts_.max_frame_time);
}

void channel_impl::frame_complete() {
  frame_due_ = clock::time_point::max();
  frame_len_ = 0;
}

void channel_impl::handle_pong(const wire::Pong& p) {
  const auto& sent = recent_pings_[p.sequence() % recent_pings_.size()];
  if (p.sequence() == 0 || sent.first != p.sequence() || sent.second != p.sent_ns()) return;  // not ours
  const double us = static_cast<double>(now_ns() - p.sent_ns()) / 1000.0;
  last_rtt_us_.store(us);
  ewma(rtt_us_, us);
  rtt_window_[n_rtt_++ % rtt_window_.size()] = us;
  const std::size_t n = std::min(n_rtt_, rtt_window_.size());
  base_rtt_us_.store(*std::min_element(rtt_window_.begin(), rtt_window_.begin() + static_cast<std::ptrdiff_t>(n)));
}

asio::awaitable<std::optional<message>> channel_impl::read_message() {
  std::byte header[frame_header_bytes];
  std::size_t got = 0;
  status st = co_await read_exact(header, frame_header_bytes, got);
  if (!st) {
    if (got == 0 && st.error().code() == errc::closed) {
      // The peer's close_notify between frames: a clean close.
      if (!closing_) begin_close("closed by peer");
      reader_done_ = true;
      inbox_wake_.notify();
      state_wake_.notify();
      maybe_finish();
    } else if (got > 0) {
      abort(errc::bad_frame, "truncated frame header (" + std::to_string(got) + " of 4 bytes): " + st.error().reason());
    } else {
      abort(st.error().code(), st.error().reason());
    }
    co_return std::nullopt;
  }
  const std::uint32_t len = read_frame_length(header);
  if (auto why = check_frame_length(len, opts_.limits)) {
    abort(errc::bad_frame, *why);
    co_return std::nullopt;
  }
  frame_length_known(len);
  // A large frame's buffer starts at initial_frame_buffer and takes the whole frame's size once
  // that much has arrived (one copy): a peer that announces the largest frame allowed and sends
  // little of it holds little memory here.
  const std::size_t total = frame_header_bytes + static_cast<std::size_t>(len);
  aligned_bytes buf = aligned_bytes::allocate(std::min(total, frame_header_bytes + initial_frame_buffer));
  if (buf.empty()) {
    abort(errc::out_of_memory, "cannot allocate " + std::to_string(len) + " bytes for a frame");
    co_return std::nullopt;
  }
  std::memcpy(buf.data(), header, frame_header_bytes);
  const auto t0 = clock::now();
  std::size_t have = 0;
  while (have < len) {
    if (frame_header_bytes + have == buf.size()) {
      aligned_bytes bigger = aligned_bytes::allocate(total);
      if (bigger.empty()) {
        abort(errc::out_of_memory, "cannot allocate " + std::to_string(len) + " bytes for a frame");
        co_return std::nullopt;
      }
      std::memcpy(bigger.data(), buf.data(), frame_header_bytes + have);
      buf = std::move(bigger);
    }
    const std::size_t want = buf.size() - frame_header_bytes - have;
    st = co_await read_exact(buf.data() + frame_header_bytes + have, want, got);
    have += got;
    if (!st) {
      abort(errc::bad_frame, "truncated frame (" + std::to_string(have) + " of " + std::to_string(len) +
                                 " bytes): " + st.error().reason());
      co_return std::nullopt;
    }
  }
  if (len >= bandwidth_min_frame) {
    const double secs = std::chrono::duration<double>(clock::now() - t0).count();
    if (secs > 0) receive_bps_.add(static_cast<double>(len) / secs);
  }
  frame_complete();
  bytes_received_ += frame_header_bytes + len;
  auto decoded = decode_frame(std::move(buf), opts_.limits);
  if (!decoded) {
    abort(errc::bad_frame, decoded.error().reason());
    co_return std::nullopt;
  }
  co_return std::move(decoded.value());
}

void bandwidth_estimate::add(double sample) {
  constexpr double factor = 1.5;
  const double avg = avg_.load();
  const int off = avg == 0 ? 0 : sample > avg * factor ? 1 : sample * factor < avg ? -1 : 0;
  if (off != 0 && off == off_) {
    avg_.store((sample + last_) / 2);
    off_ = 0;
  } else {
    ewma(avg_, sample);
    off_ = off;
  }
  last_ = sample;
}

asio::awaitable<void> channel_impl::reader(std::shared_ptr<channel_impl> self) {
  while (!closed_) {
    while (inbox_bytes_ >= opts_.max_inbox_bytes && !closed_) {
      reader_paused_ = true;
      co_await inbox_space_wake_.wait();
    }
    if (reader_paused_) {
      reader_paused_ = false;
      last_rx_ = clock::now();
    }
    if (closed_) break;
    auto next = co_await read_message();
    if (!next) break;
    if (!got_first_frame_) {
      got_first_frame_ = true;
      state_wake_.notify();
    }
    message& m = *next;
    if (const auto* ping = m.as<wire::Ping>()) {
      if (pongs_queued_ == 0 && !closing_) {
        queue_control(make_pong(ping->sequence(), ping->sent_ns()));
        ++pongs_queued_;
      }
      continue;
    }
    if (const auto* pong = m.as<wire::Pong>()) {
      handle_pong(*pong);
      continue;
    }
    ++messages_received_;
    last_data_recv_ = clock::now();
    inbox_bytes_ += m.frame_bytes();
    inbox_.push_back(std::move(m));
    inbox_wake_.notify();
    // Let the receiver take it before reading on: keeps the inbox (and its memory) shallow
    // while the application keeps up.
    co_await asio::post(ex_, asio::use_awaitable);
  }
  reader_done_ = true;
  inbox_wake_.notify();
  state_wake_.notify();
}

asio::awaitable<status> channel_impl::write_frame(outgoing& item) {
  const auto* data = reinterpret_cast<const std::byte*>(item.buf.data());
  const std::size_t size = item.buf.size();
  auto t0 = clock::now(), t1 = t0;
  if (!emulator_.active()) {
    status st = co_await stream_->write_all(std::span<const std::byte>(data, size));
    if (!st) co_return st;
    bytes_sent_ += size;
    t1 = clock::now();
  } else {
    // Each piece is held back until it would have arrived (departure + latency), a delay a real
    // sender's writes do not see: the frame's time is its time on the link, from the moment the
    // link starts on its first piece to the departure of its last.
    for (std::size_t off = 0; off < size;) {
      const std::size_t n = std::min(emulation_chunk, size - off);
      const auto slot = emulator_.pass(n, item.queued);
      if (off == 0) t0 = slot.start;
      t1 = slot.depart;
      const auto when = slot.arrive;
      if (when > clock::now()) {
        writer_timer_.expires_at(when);
        co_await writer_timer_.async_wait(nothrow);
        if (closed_) co_return failure(close_code_, "channel closed");
      }
      status st = co_await stream_->write_all(std::span<const std::byte>(data + off, n));
      if (!st) co_return st;
      bytes_sent_ += n;
      off += n;
    }
  }
  // Frames sent back to back (each queued before the link finished the one before) kept the link
  // busy: together they measure it as one large frame would. A frame after an idle link starts a
  // new run: the link's burst allowance refilled meanwhile.
  if (item.queued > run_end_) {
    run_bytes_ = 0;
    run_time_ = {};
  }
  run_bytes_ += size;
  run_time_ += t1 - t0;
  run_end_ = t1;
  if (run_bytes_ >= send_sample_bytes()) {
    last_big_send_ = clock::now();
    const double secs = std::chrono::duration<double>(run_time_).count();
    if (secs > 0) send_bps_.add(static_cast<double>(run_bytes_) / secs);
    run_bytes_ = 0;
    run_time_ = {};
  }
  co_return status{};
}

// However the writer ends (closed, failed, or destroyed with its io_context), posters waiting
// for space must not wait for it any longer.
class release_posters {
 public:
  explicit release_posters(channel_impl& c) : c_(c) {}
  ~release_posters() { c_.stop_accepting(); }
  release_posters(const release_posters&) = delete;
  release_posters& operator=(const release_posters&) = delete;

 private:
  channel_impl& c_;
};

void channel_impl::data_written(std::size_t size) {
  {
    std::lock_guard lock(data_mu_);
    bytes_queued_ -= size;
    bytes_in_flight_.store(bytes_queued_);
  }
  space_cv_.notify_all();
  space_wake_.notify();
}

asio::awaitable<void> channel_impl::writer(std::shared_ptr<channel_impl> self) {
  release_posters release(*this);
  while (!closed_) {
    // Control frames first; a data frame leaves the queue (under the lock) before it is written,
    // its bytes still counted until written.
    outgoing item;
    bool control = false;
    bool have = false;
    if (!control_q_.empty()) {
      item = std::move(control_q_.front());
      control_q_.pop_front();
      control = have = true;
    } else {
      std::lock_guard lock(data_mu_);
      if (!data_q_.empty()) {
        item = std::move(data_q_.front());
        data_q_.pop_front();
        have = true;
      }
    }
    if (!have) {
      if (closing_) {
        co_await stream_->shutdown();
        writer_done_ = true;
        maybe_finish();
        break;
      }
      co_await writer_wake_.wait();
      continue;
    }
    const std::size_t size = item.buf.size();
    status st = co_await write_frame(item);
    if (!control) data_written(size);
    if (!st) {
      abort(st.error().code(), st.error().reason());
      break;
    }
    if (control) {
      const auto* root = flatbuffers::GetSizePrefixedRoot<wire::Message>(item.buf.data());
      if (root->body_type() == wire::Body::Ping) --pings_queued_;
      if (root->body_type() == wire::Body::Pong) --pongs_queued_;
    } else {
      ++messages_sent_;
      last_data_send_ = clock::now();
    }
  }
  writer_done_ = true;
  state_wake_.notify();
}

asio::awaitable<void> channel_impl::heartbeat(std::shared_ptr<channel_impl> self) {
  // A quarter of the idle timeout at most: the peer's Pongs then arrive several times within
  // it, and a quiet link is not taken for a lost one because a Ping came a little late.
  auto period = opts_.heartbeat.count() > 0 ? opts_.heartbeat : opts_.idle_timeout / 4;
  if (opts_.idle_timeout.count() > 0) period = std::min(period, opts_.idle_timeout / 4);
  period = std::max(period, std::chrono::milliseconds(1));
  while (!closing_ && !closed_) {
    heartbeat_timer_.expires_after(period);
    co_await heartbeat_timer_.async_wait(nothrow);
    if (closing_ || closed_) break;
    if (opts_.idle_timeout.count() > 0 && !reader_paused_ && clock::now() - last_rx_ > opts_.idle_timeout) {
      abort(errc::timeout, "idle timeout: nothing received for " + std::to_string(opts_.idle_timeout.count()) + " ms");
      break;
    }
    if (clock::now() > frame_due_) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - frame_began_).count();
      abort(errc::timeout, frame_len_ ? "a frame of " + std::to_string(frame_len_) + " bytes still incomplete after " +
                                            std::to_string(ms) + " ms (the peer sends too slowly)"
                                      : "a frame header still incomplete after " + std::to_string(ms) + " ms");
      break;
    }
    if (opts_.heartbeat.count() > 0 && pings_queued_ == 0) {
      // A link that carries no large frames is probed now and then: its bandwidth may have
      // changed since last seen. More often while it carries small ones either way: training
      // uses it, and the splitter needs to know when moving blocks across it pays again.
      const auto now = clock::now();
      const bool in_use =
          now - std::max(last_data_send_, last_data_recv_) < std::max(period, opts_.bandwidth_probe_in_use);
      const auto every = in_use && opts_.bandwidth_probe_in_use.count() > 0
                             ? std::min(opts_.bandwidth_probe, opts_.bandwidth_probe_in_use)
                             : opts_.bandwidth_probe;
      // A probe that found the link changed is confirmed by the next.
      // (Half a period early: the ticks that follow a frame come a little short of the period.)
      const bool probe = opts_.bandwidth_probe.count() > 0 && bytes_in_flight_.load() == 0 &&
                         (now - last_big_send_ + period / 2 >= every || send_bps_.unconfirmed());
      if (probe) last_big_send_ = clock::now();
      queue_ping(probe ? send_sample_bytes() : 0);
    }
  }
}

}  // namespace cleave::transport::detail
