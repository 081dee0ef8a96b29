// The split step as one loop in one process: a device's micro-batches forward up its route, into
// the loss, backward down, each segment's optimizer stepping once the step's last one is back.
//
// The nodes run this same loop with a channel where a hop is (runtime::segment_runner on each
// tier); here a hop is a copy through host bytes, as the network moves a tensor, so that each tier
// may sit on a backend of its own. Tests take it as the oracle of split training.
#pragma once

#include <cstdint>
#include <map>

#include "cleave/split/pipeline.h"

namespace cleave::split {

// The segment host of each tier of one device's route, each on its own backend
// (segment_host::device_backend).
using tier_hosts = std::map<core::tier, segment_host*>;

// t on `from` -> the same values in a new tensor on `to`, through host bytes.
core::tensor cross_hop(core::backend& from, core::backend& to, const core::tensor& t);

struct split_step_result {
  double loss = 0;  // the step's mean loss (micro-batches weighted by their share)
  std::uint32_t n_correct = 0;
  int end_segment = 0;  // the highest segment a backward pass ended in (0: all reached the device's bottom)
};

// Step `step` of `device` along route r, hosted by `hosts` (every segment of r hosted there):
// x (B, in...) f32 and y (B) i32 on the device tier's backend, in n_micro_batches micro-batches of
// B / n_micro_batches samples (B divisible). Dropout draws from the micro-batch's seed as the
// nodes' do (core/micro_batch_seed.h).
split_step_result split_step(const tier_hosts& hosts, std::uint32_t device, const route& r, std::uint64_t step,
                             const core::tensor& x, const core::tensor& y, std::uint32_t n_micro_batches = 1);

}  // namespace cleave::split
