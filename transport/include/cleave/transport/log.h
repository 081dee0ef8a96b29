// The transport's logger: one line per event that matters (connection accepted, refused with its
// reason, channel closed with its reason).
#pragma once

#include <spdlog/logger.h>

#include <memory>

namespace cleave::transport {

// The "transport" logger; created on first use with the default logger's sinks and level.
std::shared_ptr<spdlog::logger> logger();

}  // namespace cleave::transport
