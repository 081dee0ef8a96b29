// The server's checkpoints on disk: written after every round with the previous ones kept, and
// the newest readable one found at start, checked against this run's settings.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cleave/core/checkpoint.h"
#include "cleave/runtime/segment_runner.h"
#include "cleave/server/server_node.h"

namespace cleave::server {

// Each device's server replicas' optimizer state.
using optimizer_states = std::map<std::uint32_t, std::vector<runtime::segment_runner::optimizer_state>>;

// What a checkpoint resumed from gives back besides the trainer's fields.
struct resumed_run {
  core::checkpoint ck;
  std::string from;  // its file
  std::uint64_t run_id = 0;
  std::uint32_t plan_epoch = 1;
  double test_accuracy = 0, test_loss = 0;
  optimizer_states opt;
};

class checkpoint_store {
 public:
  checkpoint_store(const server_config& c, const core::model_spec& m) : c_(c), model_(m) {}
  // Throws core::error when --checkpoint cannot be written (before any training).
  void check_path() const;
  // Writes ck (the global model in the trainer's format, round `round`) with the server replicas'
  // optimizer state `opt`, this run's settings and `meta` added; "" or why it failed (the
  // previous files are kept then).
  std::string save(core::checkpoint ck, std::uint64_t round, const optimizer_states& opt,
                   const std::map<std::string, std::string>& meta) const;
  // The newest readable checkpoint to resume from; none when there is none or --fresh. Throws
  // core::error when there are only unreadable ones, one of another run's settings, or --fresh
  // would overwrite one without --force.
  std::optional<resumed_run> load() const;

 private:
  // The settings a checkpoint must have been written under to be resumed: name -> value.
  std::vector<std::pair<std::string, std::string>> fingerprint() const;
  core::checkpoint_series series() const;  // --checkpoint and the kept ones

  const server_config& c_;
  const core::model_spec& model_;
};

}  // namespace cleave::server
