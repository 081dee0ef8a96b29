// Network emulation on one direction of a channel: a bandwidth cap (token bucket) and added
// one-way latency, both changeable while the channel runs. Tests and demos of the adaptive
// splitter use it to make loopback look like a slow or distant link.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace cleave::transport {

struct link_caps {
  double bytes_per_second = 0;         // 0: unlimited
  std::size_t burst_bytes = 64 << 10;  // bucket depth
  std::chrono::microseconds latency{0};

  bool active() const { return bytes_per_second > 0 || latency.count() > 0; }
};

// Schedules the bytes a sender writes: a chunk queued at time t leaves the (virtual) link after
// the bucket has enough tokens and arrives `latency` later; the sender writes it at its arrival
// time. Latency delays data without limiting throughput. Thread-safe.
class net_emulator {
 public:
  using clock = std::chrono::steady_clock;

  net_emulator() = default;
  explicit net_emulator(const link_caps& caps) : caps_(caps) {}

  void set(const link_caps& caps);
  void set_bandwidth(double bytes_per_second);
  void set_latency(std::chrono::microseconds latency);
  link_caps caps() const;
  bool active() const;

  // A chunk's passage: the link starts on it (it was queued and the chunks before it have left),
  // it has left (the bucket paid for it), it arrives (`latency` later: when it may be written).
  struct slot {
    clock::time_point start, depart, arrive;
  };
  // The passage of `bytes` queued at `queued`. Successive calls describe successive chunks in the
  // order they are sent.
  slot pass(std::size_t bytes, clock::time_point queued);
  // When `bytes` queued at `queued` may be written: pass(bytes, queued).arrive.
  clock::time_point schedule(std::size_t bytes, clock::time_point queued) { return pass(bytes, queued).arrive; }

 private:
  mutable std::mutex mu_;
  link_caps caps_;
  double tokens_ = 0;
  bool started_ = false;
  clock::time_point last_{};  // virtual time of the bucket's last update
};

}  // namespace cleave::transport
