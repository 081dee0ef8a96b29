// The message of the core::error a callable throws ("" when it throws none): tests of bad
// input check the message, not only that something failed.
#pragma once

#include <functional>
#include <string>

#include "cleave/core/error.h"

namespace cleave::testing {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const core::error& e) {
    return e.what();
  }
  return "";
}

}  // namespace cleave::testing
