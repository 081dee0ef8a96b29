// The transport's logger: one line per event that matters (connection accepted, refused with its
// reason, channel closed with its reason).
#pragma once

#include <spdlog/logger.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>

namespace cleave::transport {

// The "transport" logger; created on first use with the default logger's sinks and level.
std::shared_ptr<spdlog::logger> logger();

// The completion of a transport coroutine: an exception escaping it (a bug) is logged with
// `what` and handed to on_error (e.g. to close that channel), never to the process.
std::function<void(std::exception_ptr)> log_failure(std::string what,
                                                    std::function<void(const std::string&)> on_error = {});

}  // namespace cleave::transport
