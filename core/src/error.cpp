// Reporting of programmer errors (CLEAVE_ASSERT).
#include "cleave/core/error.h"

#include <cstdio>
#include <cstdlib>

namespace cleave::core {

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "cleave: internal error at %s:%d: assertion `%s` failed%s%s\n", file, line, expr,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

std::string printable(std::string_view text, std::size_t max_chars) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= max_chars) return out + "... (" + std::to_string(text.size() - i) + " more bytes)";
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string message_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace cleave::core
