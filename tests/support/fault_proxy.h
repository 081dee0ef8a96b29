// A fault-injecting TCP proxy on loopback for the tests: it sits between a client (a device agent)
// and a server port and reproduces the link faults an operator meets (stalls, resets, lost flows, delay).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

namespace cleave::testing {

// Listens on 127.0.0.1 and forwards every accepted connection to 127.0.0.1:target_port, on its own
// io thread. Every public method is thread-safe and has taken effect when it returns.
//
// A clean close (EOF) on either side is passed on as a clean close (shutdown send) on the other; an
// error on either side (reset, failed connect to the target) resets the other side.
//
// Bytes move one chunk (at most 64 KiB) at a time per direction: memory stays bounded, and with a
// delay d a direction forwards at most one chunk per d. A write already under way when pause() or
// half_open() is called may complete; nothing read afterwards is forwarded.
class fault_proxy {
 public:
  // Listens on 127.0.0.1:0 (any free port); connections go to 127.0.0.1:target_port.
  explicit fault_proxy(std::uint16_t target_port);
  // Closes every socket (clean close, silenced connections included) and joins the io thread.
  ~fault_proxy();
  fault_proxy(const fault_proxy&) = delete;
  fault_proxy& operator=(const fault_proxy&) = delete;

  // Where clients connect.
  std::uint16_t port() const;

  // Stops forwarding bytes in both directions on every connection: bytes are held, not dropped, and
  // connections stay open. Connections accepted while paused are held too (the target sees them
  // only after resume()).
  void pause();
  // Forwards again; held bytes go first, in order.
  void resume();
  // Resets every open connection on both sides (SO_LINGER 0 then close): the peers see ECONNRESET,
  // not a clean EOF.
  void reset_all();
  // Every connection open now goes silent for good: nothing more is forwarded either way and nothing
  // is closed (a NAT box or Wi-Fi access point that lost the flow). Later connections work normally.
  void half_open();
  // Each chunk is forwarded d after it was read (0: at once). Applies to chunks already held too.
  void set_delay(std::chrono::milliseconds d);

  // Connections accepted so far.
  int n_accepted() const;
  // Forwarded connections open now (connecting ones included, silenced ones not).
  int n_open() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace cleave::testing
