// Ordered sending from any thread.
#include "cleave/transport/outbox.h"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>

namespace cleave::transport {

void outbox::post(message_builder&& m) {
  {
    std::lock_guard lock(mu_);
    q_.push_back(std::move(m));
    if (draining_) return;
    draining_ = true;
  }
  start_drain();
}

std::size_t outbox::queued() const {
  std::lock_guard lock(mu_);
  return q_.size();
}

void outbox::start_drain() {
  auto self = shared_from_this();
  asio::co_spawn(
      ex_,
      [self]() -> asio::awaitable<void> {
        for (;;) {
          message_builder m;
          {
            std::lock_guard lock(self->mu_);
            if (self->q_.empty()) {
              self->draining_ = false;
              co_return;
            }
            m = std::move(self->q_.front());
            self->q_.pop_front();
          }
          const status s = co_await self->ch_->send(std::move(m));
          if (!s) {
            std::lock_guard lock(self->mu_);
            self->q_.clear();
            self->draining_ = false;
            co_return;
          }
        }
      },
      asio::detached);
}

}  // namespace cleave::transport
