// Progress display.
#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace cleave::apps {

progress_bar::progress_bar(std::string title) : title_(std::move(title)), tty_(::isatty(STDERR_FILENO) == 1) {}

void progress_bar::update(std::int64_t done, std::int64_t total, const std::string& status) {
  total_ = total;
  const double frac = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  if (tty_) {
    constexpr int width = 28;
    const int filled = static_cast<int>(frac * width);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r%s [%s] %3d%% %lld/%lld %s\x1b[K", title_.c_str(), bar.c_str(),
                 static_cast<int>(frac * 100), static_cast<long long>(done), static_cast<long long>(total),
                 status.c_str());
    std::fflush(stderr);
    return;
  }
  const int decile = static_cast<int>(frac * 10);
  if (decile != last_decile_ && decile < 10) {
    last_decile_ = decile;
    std::fprintf(stderr, "%s %3d%% %lld/%lld %s\n", title_.c_str(), decile * 10, static_cast<long long>(done),
                 static_cast<long long>(total), status.c_str());
  }
}

void progress_bar::finish(const std::string& status) {
  if (tty_) std::fprintf(stderr, "\r\x1b[K");
  std::fprintf(stderr, "%s done %lld/%lld %s\n", title_.c_str(), static_cast<long long>(total_),
               static_cast<long long>(total_), status.c_str());
  std::fflush(stderr);
}

}  // namespace cleave::apps
