// An outbox: messages handed over from any thread are sent on one channel in the order given,
// by one coroutine on the channel's executor. A failed send drops what is queued (the reader
// of the channel sees the closure and reports it).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "cleave/transport/channel.h"

namespace cleave::transport {

class outbox : public std::enable_shared_from_this<outbox> {
 public:
  explicit outbox(channel& ch) : ch_(&ch), ex_(ch.get_executor()) {}

  // Thread-safe. The channel must outlive the outbox's queued work (close it through close()).
  void post(message_builder&& m);
  std::size_t queued() const;

 private:
  void start_drain();
  channel* ch_;
  asio::any_io_executor ex_;
  mutable std::mutex mu_;
  std::deque<message_builder> q_;
  bool draining_ = false;
};

}  // namespace cleave::transport
