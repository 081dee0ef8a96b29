// The "transport" logger.
#include "cleave/transport/log.h"

#include <spdlog/spdlog.h>

#include <mutex>

#include "cleave/core/error.h"

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

std::function<void(std::exception_ptr)> log_failure(std::string what,
                                                    std::function<void(const std::string&)> on_error) {
  return [what = std::move(what), on_error = std::move(on_error)](std::exception_ptr e) {
    if (!e) return;
    const std::string text = core::message_of(e);
    logger()->error("{} failed: {}", what, text);
    if (on_error) on_error(what + " failed: " + text);
  };
}

}  // namespace cleave::transport
