// A channel: one mutually authenticated TLS 1.3 connection carrying verified FlatBuffers messages,
// with a bounded send queue (backpressure), heartbeats, an idle timeout, a network emulator and
// the statistics the splitter needs (bytes, RTT, bandwidth).
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "cleave/core/tier.h"
#include "cleave/transport/frame.h"
#include "cleave/transport/message.h"
#include "cleave/transport/net_emulator.h"
#include "cleave/transport/result.h"

namespace cleave::transport {

class tls_stream;

struct channel_options {
  frame_limits limits;                            // inbound frames
  std::size_t max_bytes_in_flight = 64u << 20;    // queued + being written; send() and post() wait above it
  std::size_t max_inbox_bytes = 256u << 20;       // received, not yet taken by receive()
  std::chrono::milliseconds heartbeat{1000};      // Ping period, at most idle_timeout / 4 (0: no Pings)
  std::chrono::milliseconds idle_timeout{10000};  // close when nothing arrives for this long (0: never)
  // A frame, once begun, must be complete within idle_timeout plus its size at this rate
  // (bytes per second), so a peer trickling bytes cannot hold a channel (0: no bound)...
  double min_frame_rate = 32 * 1024;
  // ...and within this in all, whatever its size (0: no bound beyond the rate's): 256 MiB at
  // the rate above would take 2.3 hours.
  std::chrono::milliseconds max_frame_time{300000};
  std::chrono::milliseconds close_timeout{2000};  // bound on a clean close
  // When no frame of 64 KiB or more went out for this long, a heartbeat carries 64 KiB of
  // padding so the link's bandwidth stays measured (0: never); this often instead while smaller
  // application frames go out or come in (the link is in use; 0: no difference).
  std::chrono::milliseconds bandwidth_probe{10000};
  std::chrono::milliseconds bandwidth_probe_in_use{2000};
  link_caps emulation;  // initial network emulation of outgoing data
};

// A snapshot of a channel's counters. RTT comes from heartbeats (Ping/Pong); bandwidths are
// EWMAs over frames of at least 64 KiB (send: time to hand them to the socket; receive: time
// from their first to last byte) that follow a changed link after two frames.
struct channel_stats {
  std::uint64_t bytes_sent = 0;  // frame bytes, length prefixes included
  std::uint64_t bytes_received = 0;
  std::uint64_t messages_sent = 0;  // application messages (heartbeats excluded)
  std::uint64_t messages_received = 0;
  std::uint64_t bytes_in_flight = 0;  // queued for sending now
  double rtt_us = 0;                  // EWMA; 0 until the first Pong
  double last_rtt_us = 0;
  double base_rtt_us = 0;            // the smallest of the last 8: the link's own delay, without queueing
  double send_bytes_per_second = 0;  // 0 until measured
  double receive_bytes_per_second = 0;
};

// The round trip of the link itself (the base RTT, or the average until there is one).
inline double link_rtt_us(const channel_stats& s) {
  return s.base_rtt_us > 0 ? s.base_rtt_us : s.rtt_us;
}
// The link's bandwidth as this end measures it: its send direction (0: not measured), the
// receive direction only until then. A sender times every frame it sends from its first byte and
// probes the link when its frames are small; a receiver sees a frame only once its first bytes
// arrived, and only frames of 64 KiB or more, so its figure may be as old as the last large one.
// The other direction is the peer's to measure: the splitter takes the slower of the two.
inline double link_bytes_per_second(const channel_stats& s) {
  return s.send_bytes_per_second > 0 ? s.send_bytes_per_second : s.receive_bytes_per_second;
}

namespace detail {
class channel_impl;
}

// A handle to a connection. All members except post(), stats(), emulate(), is_open() and
// close_reason() must be called on the channel's executor (its io_context thread); post() may be
// called from any thread while no thread modifies the handle. Dropping the handle closes the
// channel cleanly in the background (queued messages are still sent, within close_timeout) and
// refuses posts from then on.
class channel {
 public:
  channel() = default;
  explicit channel(std::shared_ptr<detail::channel_impl> impl);
  ~channel();
  channel(channel&&) noexcept = default;
  channel& operator=(channel&& other) noexcept;
  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;

  // Queues a finished message; waits while more than max_bytes_in_flight are queued (a single
  // message may exceed that bound). Fails when the channel is closed or the message exceeds
  // the peer-side frame limit this channel was given (limits.max_frame_bytes).
  asio::awaitable<status> send(message_builder&& m);
  // Thread-safe: queues a finished message behind everything posted or sent before. Called off the
  // channel's executor it blocks while more than max_bytes_in_flight are queued, until the writer
  // drains or the channel closes (backpressure reaches the producing thread); on the executor it
  // never blocks (a node's I/O thread must not wait on itself). False, and the message dropped,
  // when the channel is closed or the message exceeds the frame limit.
  bool post(message_builder&& m) const;
  // The next message, verified and decoded; fails once the channel is closed and every
  // message that arrived before has been taken. One receiver at a time.
  asio::awaitable<result<message>> receive();
  // Closes cleanly: sends what is queued, then TLS close_notify, then waits (up to
  // close_timeout) for the peer's. Messages arriving meanwhile stay receivable.
  asio::awaitable<void> close();

  bool is_open() const;
  // Why the channel closed ("" while open).
  std::string close_reason() const;
  // The peer's identity: the common name of its certificate, checked against the CA.
  const std::string& peer_identity() const;
  std::optional<core::tier> peer_role() const;
  // The node id the peer's certificate binds (transport/certs.h: node_id_of).
  std::optional<std::uint32_t> peer_node_id() const;
  // The serial number of the peer's certificate, upper-case hex (checked against revocations).
  const std::string& peer_serial() const;
  // "address:port" of the peer.
  const std::string& remote() const;
  channel_stats stats() const;
  // Emulates this link for this side's outgoing traffic from now on (thread-safe, effective
  // immediately). The measured bandwidths learn of the change as they would of a real link's:
  // from the frames and probes that cross it.
  void emulate(const link_caps& caps);
  asio::any_io_executor get_executor() const;

  explicit operator bool() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<detail::channel_impl> impl_;
};

// Starts a channel over a stream that finished its handshake (used by listener and connect).
channel start_channel(std::unique_ptr<tls_stream> stream, const channel_options& opts);

}  // namespace cleave::transport
