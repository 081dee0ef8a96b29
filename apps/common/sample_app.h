// What the sample apps share around their federation: the settings of its run and their flags,
// a work directory for the certificates, the federation with its server set up, the per-round
// line, the final result against --min-accuracy, and errors as exit status 2.
#pragma once

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "cleave/federation/local_federation.h"

namespace cleave::apps {

// The settings every sample app takes: its federation's run, and where and how it runs.
struct run_options {
  int rounds = 3;
  int local_steps = 50;
  int batch = 32;
  float lr = 0.05f;
  std::uint64_t seed = 1;
  std::string backend = "auto";
  bool no_edge = false;
  std::string work;
  double min_accuracy = 0;
  std::string log_level = "warn";
};

// Their flags (after the app's own).
inline void add_run_options(CLI::App& app, run_options& o) {
  app.add_option("--rounds", o.rounds)->capture_default_str();
  app.add_option("--local-steps", o.local_steps, "steps per device per round")->capture_default_str();
  app.add_option("--batch", o.batch)->capture_default_str();
  app.add_option("--lr", o.lr)->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--backend", o.backend)->capture_default_str();
  app.add_flag("--no-edge", o.no_edge, "devices connect straight to the server");
  app.add_option("--work", o.work, "directory for the certificates (default: a temporary one, removed)");
  app.add_option("--min-accuracy", o.min_accuracy, "exit 1 when the final test accuracy is below this");
  app.add_option("--log-level", o.log_level)->capture_default_str();
}

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

// A federation of n_devices (certificates provisioned in `work`, devices through the edge unless
// --no-edge) whose server runs these settings, waits for every device and prints every round;
// the app adds its model, test data and devices.
inline federation::local_config local_federation(const run_options& o, const std::filesystem::path& work,
                                                 int n_devices) {
  federation::provision_local(work / "certs", n_devices);
  federation::local_config fc;
  fc.certs = work / "certs";
  fc.use_edge = !o.no_edge;
  server::server_config& sc = fc.server;
  sc.rounds = o.rounds;
  sc.local_steps = o.local_steps;
  sc.batch = o.batch;
  sc.min_devices = n_devices;
  sc.seed = o.seed;
  sc.backend = o.backend;
  sc.opt.lr = o.lr;
  sc.on_round = print_round;
  return fc;
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

// Runs the federation; prints the final test accuracy over `what` (e.g. "test images") and
// returns 0, or 1 when no round finished or the accuracy is below --min-accuracy.
inline int run_and_report(federation::local_config fc, double min_accuracy, const std::string& what) {
  const auto result = federation::run_local(std::move(fc));
  const server::round_report* last = last_round(result);
  if (!last) return 1;
  std::printf("final test accuracy %.4f over %lld %s\n", last->test_accuracy,
              static_cast<long long>(last->test_samples), what.c_str());
  return check_accuracy(last->test_accuracy, min_accuracy);
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
