// The state behind a channel handle and its three coroutines: reader (frames in, Ping/Pong,
// inbox), writer (queues out, emulation, TLS close) and heartbeat (Pings, idle timeout).
// Everything runs on the channel's executor except post() and the data queue it shares with
// the writer (under data_mu_).
#pragma once

#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <array>
#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "cleave/transport/channel.h"
#include "cleave/transport/tls_stream.h"

namespace cleave::transport::detail {

using clock = std::chrono::steady_clock;

constexpr auto nothrow = asio::experimental::as_tuple(asio::use_awaitable);
constexpr std::size_t emulation_chunk = 64 << 10;      // emulated links send in pieces this large
constexpr std::size_t bandwidth_min_frame = 64 << 10;  // smaller frames do not measure bandwidth
constexpr std::size_t initial_frame_buffer = 4u << 20;  // larger frames: their whole size once this arrived
// ... except sent frames that take this long on a link as fast as measured (at 10 Mbit/s 20 KB
// do): a link's burst allowance (an emulated link's 1 ms) then distorts a sample by 7% at most,
// and a probe on a slow link holds the frames behind it 16 ms, not 52.
constexpr double bandwidth_sample_seconds = 0.016;
constexpr std::size_t bandwidth_min_sample = 8 << 10;

inline std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count());
}

// An exponentially weighted average (alpha 0.25) that starts at its first sample.
inline void ewma(std::atomic<double>& avg, double sample) {
  const double old = avg.load();
  avg.store(old == 0 ? sample : old + 0.25 * (sample - old));
}

// A link's bandwidth from its samples: the EWMA above, which smooths a sample's noise but takes
// many samples to follow a link that changed (10 to 50 Mbit/s: 6 samples to get within 20%). So
// two samples in a row off the average by more than a factor of 1.5, the same way, replace it
// with their mean: a changed link is followed after two samples, one outlier moves it by a quarter.
// (An idle channel probes again at once after a sample that was off, so two probes suffice.)
// value() from any thread, the rest on the executor.
class bandwidth_estimate {
 public:
  void add(double sample);
  double value() const { return avg_.load(); }
  // The last sample was off the average by the factor: the next one decides.
  bool unconfirmed() const { return off_ != 0; }
  // The rate a sample's size is reckoned at: the lower of the average and the last sample, so
  // that a sample which found the link slower is confirmed by the next frames of the same size.
  double sizing_rate() const { return last_ > 0 && last_ < avg_.load() ? last_ : avg_.load(); }

 private:
  std::atomic<double> avg_{0};
  int off_ = 0;      // the last sample: +1 above, -1 below the average by the factor, else 0
  double last_ = 0;  // the last sample
};

// A condition to wait for on one executor: a timer that never expires and is cancelled to wake
// every waiter. Waiters re-check their condition after waking.
class wakeup {
 public:
  explicit wakeup(const asio::any_io_executor& ex) : timer_(ex, clock::time_point::max()) {}
  asio::awaitable<void> wait();
  void notify() { timer_.cancel(); }

 private:
  asio::steady_timer timer_;
};

// Runs `fn` unless disarmed within `after`; used to bound handshakes, connects and closes.
class watchdog {
 public:
  watchdog(const asio::any_io_executor& ex, clock::duration after, std::function<void()> fn);
  ~watchdog() { disarm(); }
  void disarm();
  bool fired() const { return state_->fired; }

 private:
  struct state {
    bool armed = true;
    bool fired = false;
  };
  asio::steady_timer timer_;
  std::shared_ptr<state> state_;
};

class channel_impl : public std::enable_shared_from_this<channel_impl> {
 public:
  channel_impl(std::unique_ptr<tls_stream> stream, const channel_options& opts);
  ~channel_impl();

  void start();
  asio::awaitable<status> send(flatbuffers::DetachedBuffer frame);
  // Thread-safe; see channel::post.
  bool post(flatbuffers::DetachedBuffer frame);
  // Thread-safe: refuses posts from now on and releases blocked posters (a dropped handle, a
  // closing channel, a writer that ended).
  void stop_accepting();
  // Application messages queued and not yet written (thread-safe).
  std::size_t queued_messages() const;
  asio::awaitable<result<message>> receive();
  asio::awaitable<void> close();
  // Starts a clean close without waiting for it.
  void begin_close(const std::string& reason);
  // Closes at once (no flush, no close_notify).
  void abort(errc code, const std::string& reason);
  // Waits for the peer's first frame (its initial Ping) or the end of the channel; with TLS 1.3
  // this is where a client learns that the server refused its certificate.
  asio::awaitable<status> wait_first_frame();

  bool is_open() const { return open_.load(); }
  std::string close_reason() const;
  const std::string& peer_identity() const { return stream_->peer_identity(); }
  std::optional<core::tier> peer_role() const { return stream_->peer_role(); }
  std::optional<std::uint32_t> peer_node_id() const { return stream_->peer_node_id(); }
  const std::string& peer_serial() const { return stream_->peer_serial(); }
  const std::string& remote() const { return stream_->remote(); }
  channel_stats stats() const;
  // The measured bandwidths are kept: they follow the changed link as they would a real one's.
  void emulate(const link_caps& caps) { emulator_.set(caps); }
  const asio::any_io_executor& executor() const { return ex_; }

 private:
  struct outgoing {
    flatbuffers::DetachedBuffer buf;
    clock::time_point queued;
  };

  asio::awaitable<void> reader(std::shared_ptr<channel_impl> self);
  asio::awaitable<void> writer(std::shared_ptr<channel_impl> self);
  asio::awaitable<void> heartbeat(std::shared_ptr<channel_impl> self);
  asio::awaitable<status> read_exact(std::byte* p, std::size_t n, std::size_t& done);
  void frame_length_known(std::uint32_t len);  // moves the frame's deadline by its size
  void frame_complete();
  // The next message off the stream; nothing once the stream ended (cleanly between frames, or
  // the channel aborted with the reason).
  asio::awaitable<std::optional<message>> read_message();
  asio::awaitable<status> write_frame(outgoing& item);
  std::optional<failure> check_frame_size(std::size_t size) const;
  // Under data_mu_: whether a message of `size` bytes fits under max_bytes_in_flight (a single
  // message larger than the bound goes alone).
  bool fits(std::size_t size) const { return bytes_queued_ == 0 || bytes_queued_ + size <= opts_.max_bytes_in_flight; }
  // Under data_mu_: appends a data frame.
  void push_data(flatbuffers::DetachedBuffer frame);
  failure closed_failure() const;
  // The writer wrote (or dropped) a data frame of `size` bytes: frees its space.
  void data_written(std::size_t size);
  // The size from which a sent frame measures the send bandwidth, and a probe's padding.
  std::size_t send_sample_bytes() const {
    const double bps = send_bps_.sizing_rate();
    if (bps <= 0) return bandwidth_min_frame;
    return static_cast<std::size_t>(
        std::clamp(bps * bandwidth_sample_seconds, double(bandwidth_min_sample), double(bandwidth_min_frame)));
  }
  void wake_writer_from_any_thread();
  bool on_io_thread() const;
  void queue_control(message_builder&& m);
  void queue_ping(std::size_t padding = 0);
  void handle_pong(const wire::Pong& p);
  void set_reason(errc code, const std::string& reason);
  void maybe_finish();
  void finish();
  void wake_all();

  std::unique_ptr<tls_stream> stream_;
  asio::any_io_executor ex_;
  channel_options opts_;
  net_emulator emulator_;

  // The data queue: filled by send() and post() from any thread, drained by the writer. Bytes
  // count from queueing until written (the writer takes a message out before writing it).
  mutable std::mutex data_mu_;
  std::condition_variable space_cv_;  // posters off the executor wait here for space or the close
  std::deque<outgoing> data_q_;
  std::size_t bytes_queued_ = 0;
  bool accepting_ = true;
  std::atomic<bool> writer_wake_posted_{false};  // coalesces wakeups posted from other threads

  std::deque<outgoing> control_q_;  // executor only
  std::deque<message> inbox_;
  std::size_t inbox_bytes_ = 0;

  wakeup writer_wake_;
  wakeup space_wake_;
  wakeup inbox_wake_;
  wakeup inbox_space_wake_;
  wakeup state_wake_;
  asio::steady_timer writer_timer_;
  asio::steady_timer heartbeat_timer_;
  std::unique_ptr<watchdog> close_watchdog_;

  bool closing_ = false;  // no new sends; writer flushes then sends close_notify
  bool closed_ = false;   // socket closed, coroutines ending
  bool reader_done_ = false;
  bool writer_done_ = false;
  bool reader_paused_ = false;  // inbox full
  bool got_first_frame_ = false;
  int pings_queued_ = 0;
  int pongs_queued_ = 0;
  std::uint64_t ping_sequence_ = 0;
  // (sequence, send time) of recent Pings: only Pongs answering one of them count.
  std::array<std::pair<std::uint64_t, std::uint64_t>, 8> recent_pings_{};
  clock::time_point last_rx_;
  // While a frame is being read: when it began, its length (0 while the header is incomplete)
  // and when it must be complete.
  clock::time_point frame_began_{};
  std::uint32_t frame_len_ = 0;
  clock::time_point frame_due_ = clock::time_point::max();
  clock::time_point last_big_send_;   // the last frame that measured the send bandwidth
  clock::time_point last_data_send_;  // the last application frame written
  clock::time_point last_data_recv_;  // the last application frame read
  // The run of frames sent back to back so far: bytes, time on the link, when the last left it.
  std::size_t run_bytes_ = 0;
  clock::duration run_time_{};
  clock::time_point run_end_{};
  errc close_code_ = errc::closed;

  mutable std::mutex reason_mu_;
  std::string close_reason_;
  std::atomic<bool> open_{true};

  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<std::uint64_t> bytes_received_{0};
  std::atomic<std::uint64_t> messages_sent_{0};
  std::atomic<std::uint64_t> messages_received_{0};
  std::atomic<std::uint64_t> bytes_in_flight_{0};
  std::atomic<double> rtt_us_{0};
  std::atomic<double> last_rtt_us_{0};
  std::atomic<double> base_rtt_us_{0};
  std::array<double, 8> rtt_window_{};  // executor only
  std::size_t n_rtt_ = 0;
  bandwidth_estimate send_bps_;
  bandwidth_estimate receive_bps_;
};

}  // namespace cleave::transport::detail
