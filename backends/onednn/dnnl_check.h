// CLEAVE_CHECK_DNNL: runs a oneDNN call and turns its dnnl::error into a core::error that names
// the failing call, so a vendor failure reaches the user as an ordinary cleave error.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "cleave/core/error.h"

namespace cleave::backend::detail {

[[noreturn]] inline void throw_dnnl_error(const char* expr, const char* file, int line, const dnnl::error& e) {
  throw core::error(std::string("oneDNN call failed: ") + expr + " (" + file + ":" + std::to_string(line) +
                    "): " + e.what() + " (status " + std::to_string(static_cast<int>(e.status)) + ")");
}

}  // namespace cleave::backend::detail

// Evaluates `expr` (any type, including void) and yields its value.
#define CLEAVE_CHECK_DNNL(expr)                                                              \
  [&]() -> decltype(auto) {                                                                  \
    try {                                                                                    \
      return expr;                                                                           \
    } catch (const dnnl::error& cleave_dnnl_e) {                                             \
      ::cleave::backend::detail::throw_dnnl_error(#expr, __FILE__, __LINE__, cleave_dnnl_e); \
    }                                                                                        \
  }()
