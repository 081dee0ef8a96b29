// Expected failures of the transport (peer lost, refused, bad frame, timeout) returned as values
// with a reason a user can act on, instead of exceptions.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "cleave/core/error.h"

namespace cleave::transport {

enum class errc {
  closed,        // the channel was closed (locally, or by the peer with a clean TLS close)
  connection,    // connect, read or write failed, or the peer vanished
  refused,       // TLS handshake or identity check failed
  bad_frame,     // a frame failed the size, structure or semantic checks
  timeout,       // handshake, connect or idle timeout
  too_large,     // an outgoing message exceeds the frame limit
  out_of_memory  // a frame buffer could not be allocated
};

std::string_view errc_name(errc e);

// Why an operation failed. A class with a constructor, not an aggregate: g++ 12 destroys
// aggregate temporaries built inside a co_await expression twice.
class failure {
 public:
  failure(errc code, std::string reason) : code_(code), reason_(std::move(reason)) {}
  errc code() const { return code_; }
  const std::string& reason() const { return reason_; }

 private:
  errc code_;
  std::string reason_;
};

// A value or a failure.
template <class T>
class result {
 public:
  // An empty result (a failure saying so); lets results travel through Asio's co_spawn.
  result() : v_(std::in_place_index<1>, failure(errc::closed, "no result")) {}
  result(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  result(failure f) : v_(std::in_place_index<1>, std::move(f)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  // Asserts ok(): reading the value of a failed result is a programmer error.
  T& value() & {
    CLEAVE_ASSERT(ok(), std::get<1>(v_).reason());
    return std::get<0>(v_);
  }
  const T& value() const& {
    CLEAVE_ASSERT(ok(), std::get<1>(v_).reason());
    return std::get<0>(v_);
  }
  T&& value() && {
    CLEAVE_ASSERT(ok(), std::get<1>(v_).reason());
    return std::get<0>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  // Asserts !ok().
  const failure& error() const {
    CLEAVE_ASSERT(!ok());
    return std::get<1>(v_);
  }

 private:
  std::variant<T, failure> v_;
};

// Success or a failure.
class status {
 public:
  status() = default;
  status(failure f) : f_(std::move(f)), failed_(true) {}

  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const failure& error() const {
    CLEAVE_ASSERT(failed_);
    return f_;
  }

 private:
  failure f_{errc::closed, {}};
  bool failed_ = false;
};

}  // namespace cleave::transport
