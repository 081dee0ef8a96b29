// Failure kinds used across cleave: programmer bugs (CLEAVE_ASSERT), and errors that abort an
// operation (cleave::core::error) carrying a message a user can act on.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace cleave::core {

// An error that aborts the current operation: bad input, vendor API failure, lost peer.
class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
};

// The message of a caught exception ("unknown error" for one that is not a std::exception).
std::string message_of(std::exception_ptr e);

// Text from a peer or a file, made safe to log: control characters, escapes and bytes outside
// printable ASCII as \xNN (no forged log lines, no terminal escapes), cut after max_chars.
std::string printable(std::string_view text, std::size_t max_chars = 240);

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace cleave::core

// For programmer errors only, never for input: always on, reports file:line.
#define CLEAVE_ASSERT(cond, ...)                                                                   \
  do {                                                                                             \
    if (!(cond)) ::cleave::core::assert_fail(#cond, __FILE__, __LINE__, std::string{__VA_ARGS__}); \
  } while (0)
