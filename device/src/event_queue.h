// A blocking queue handing events from the I/O thread to the training thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

namespace cleave::device {

template <class T>
class event_queue {
 public:
  void push(T v) {
    {
      std::lock_guard lock(mu_);
      q_.push_back(std::move(v));
    }
    cv_.notify_one();
  }
  // The next event, or nothing after `timeout`.
  std::optional<T> pop(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !q_.empty(); })) return std::nullopt;
    T v = std::move(q_.front());
    q_.pop_front();
    return v;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> q_;
};

}  // namespace cleave::device
