// Work for a device that must wait until the blocks migrating to this node for it are in:
// held in arrival order and run, still in order, once the segment host has them all.
// Used on the compute thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "cleave/core/pipeline.h"

namespace cleave::server {

class held_steps {
 public:
  // Runs `task` now unless the device still misses blocks here or has work held before it.
  void run_or_hold(const core::segment_host& host, std::uint32_t device, std::function<void()> task) {
    if (host.n_missing(device) > 0 || held_.count(device) > 0) {
      held_[device].push_back(std::move(task));
      return;
    }
    task();
  }
  // Runs the device's held work once its blocks are all in.
  void release(const core::segment_host& host, std::uint32_t device) {
    const auto it = held_.find(device);
    if (it == held_.end() || host.n_missing(device) > 0) return;
    auto tasks = std::move(it->second);
    held_.erase(it);
    for (auto& t : tasks) t();
  }
  // Drops the device's held work (it left, or its plan was replaced).
  void forget(std::uint32_t device) { held_.erase(device); }

 private:
  std::map<std::uint32_t, std::vector<std::function<void()>>> held_;
};

}  // namespace cleave::server
