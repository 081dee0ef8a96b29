// What the sample apps share around their federation: a work directory for the certificates,
// the per-round line, the final result against --min-accuracy, and errors as exit status 2.
#pragma once

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "cleave/federation/local_federation.h"

namespace cleave::apps {

// `dir`, or a temporary directory named after `prefix` and the process, removed when the app
// ends (also when it ends with an error).
class work_dir {
 public:
  work_dir(const std::string& dir, const std::string& prefix)
      : temporary_(dir.empty()),
        path_(temporary_ ? std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()))
                         : std::filesystem::path(dir)) {}
  ~work_dir() {
    std::error_code ec;
    if (temporary_) std::filesystem::remove_all(path_, ec);
  }
  work_dir(const work_dir&) = delete;
  work_dir& operator=(const work_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  bool temporary_;
  std::filesystem::path path_;
};

inline void print_round(const server::round_report& r) {
  std::printf("round %llu: %d devices, train loss %.4f, test loss %.4f acc %.4f, %.1f MB moved\n",
              static_cast<unsigned long long>(r.round), r.n_devices, r.train_loss, r.test_loss, r.test_accuracy,
              static_cast<double>(r.bytes_moved) / 1e6);
  std::fflush(stdout);
}

// The last round the server closed, or null (reported) when none did.
inline const server::round_report* last_round(const federation::local_result& r) {
  if (r.rounds.empty()) std::fprintf(stderr, "no round finished\n");
  return r.rounds.empty() ? nullptr : &r.rounds.back();
}

// 0, or 1 (reported) when the final accuracy is below the minimum asked for.
inline int check_accuracy(double accuracy, double min_accuracy) {
  if (accuracy >= min_accuracy) return 0;
  std::fprintf(stderr, "test accuracy %.4f is below --min-accuracy %.4f\n", accuracy, min_accuracy);
  return 1;
}

// run() at the log level asked for; an error ends the app with status 2 and its message.
template <class Run>
int run_guarded(const std::string& log_level, Run run) {
  spdlog::set_level(spdlog::level::from_str(log_level));
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

}  // namespace cleave::apps
