// What this build is: the version, the commit it was built from and the build type
// (`cleave --version`, the cleave_build_info metric).
#pragma once

#include <string_view>

namespace cleave::core {

struct build_info {
  std::string_view version;     // "0.1.0"
  std::string_view commit;      // 12 hex digits, or "unknown" outside a git checkout
  std::string_view build_type;  // "Release", "Debug", ...
};

const build_info& this_build();

}  // namespace cleave::core
