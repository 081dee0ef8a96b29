// Headless Chromium for the dashboard's browser tests: found at its Debian path, or the test is
// skipped (exit 77) unless CLEAVE_REQUIRE_BROWSER is set (the test script sets it: there
// Chromium is installed). Also: the first of a few paths that is a program (promtool's too).
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <string>

namespace cleave::testing {

// The first of `paths` that is an executable file ("": none).
inline std::string first_executable(std::initializer_list<const char*> paths) {
  for (const char* p : paths)
    if (::access(p, X_OK) == 0) return p;
  return {};
}

inline std::string find_chromium() {
  return first_executable({"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"});
}

// The browser's path; without one, a failure or a skip.
inline std::string require_chromium() {
  std::string browser = find_chromium();
  if (browser.empty()) {
    if (std::getenv("CLEAVE_REQUIRE_BROWSER")) FAIL("Chromium is not installed (/usr/bin/chromium)");
    MESSAGE("skipped: no Chromium");
    std::exit(77);
  }
  return browser;
}

// Runs the browser headless on `url` with `mode` (--dump-dom, --screenshot=FILE) in a window of
// `window` pixels ("WIDTH,HEIGHT"); its stdout.
inline std::string chromium(const std::string& browser, const std::filesystem::path& profile, const std::string& mode,
                            const std::string& url, const std::string& window = "1400,1100") {
  const std::string cmd = browser +
                          " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run"
                          " --hide-scrollbars --window-size=" +
                          window + " --user-data-dir='" + profile.string() + "' " + mode + " '" + url + "' 2>/dev/null";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  CHECK(::pclose(p) == 0);
  return out;
}

}  // namespace cleave::testing
