// The "transport" logger.
#include "cleave/transport/log.h"

#include <spdlog/spdlog.h>

#include <mutex>

namespace cleave::transport {

std::shared_ptr<spdlog::logger> logger() {
  static std::once_flag once;
  static std::shared_ptr<spdlog::logger> log;
  std::call_once(once, [] {
    log = spdlog::get("transport");
    if (!log) {
      log = spdlog::default_logger()->clone("transport");
      spdlog::register_logger(log);
    }
  });
  return log;
}

}  // namespace cleave::transport
