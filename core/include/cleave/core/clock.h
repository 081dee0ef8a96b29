// Wall-clock time as the records, logs and dashboards show it.
#pragma once

#include <chrono>

namespace cleave::core {

// Seconds since the Unix epoch, with a fraction.
inline double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace cleave::core
