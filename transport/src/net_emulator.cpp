// Token bucket and latency scheduling in virtual time.
#include "cleave/transport/net_emulator.h"

#include <algorithm>

namespace cleave::transport {

void net_emulator::set(const link_caps& caps) {
  std::lock_guard lock(mu_);
  caps_ = caps;
  tokens_ = std::min(tokens_, static_cast<double>(caps_.burst_bytes));
}

void net_emulator::set_bandwidth(double bytes_per_second) {
  std::lock_guard lock(mu_);
  caps_.bytes_per_second = bytes_per_second > 0 ? bytes_per_second : 0;
}

void net_emulator::set_latency(std::chrono::microseconds latency) {
  std::lock_guard lock(mu_);
  caps_.latency = latency.count() > 0 ? latency : std::chrono::microseconds{0};
}

link_caps net_emulator::caps() const {
  std::lock_guard lock(mu_);
  return caps_;
}

bool net_emulator::active() const {
  std::lock_guard lock(mu_);
  return caps_.active();
}

net_emulator::slot net_emulator::pass(std::size_t bytes, clock::time_point queued) {
  std::lock_guard lock(mu_);
  const double burst = static_cast<double>(caps_.burst_bytes);
  if (!started_) {
    started_ = true;
    last_ = queued;
    tokens_ = burst;
  }
  // The link cannot start on this chunk before it finished the previous ones.
  clock::time_point t = std::max(queued, last_);
  clock::time_point depart = t;
  if (caps_.bytes_per_second > 0) {
    const double rate = caps_.bytes_per_second;
    const double elapsed = std::chrono::duration<double>(t - last_).count();
    tokens_ = std::min(burst, tokens_ + elapsed * rate);
    tokens_ -= static_cast<double>(bytes);
    if (tokens_ < 0) {
      // Wait until the debt is paid back; the bucket is then empty.
      depart = t + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(-tokens_ / rate));
      tokens_ = 0;
    }
  } else {
    tokens_ = burst;
  }
  last_ = depart;
  return {t, depart, depart + caps_.latency};
}

}  // namespace cleave::transport
