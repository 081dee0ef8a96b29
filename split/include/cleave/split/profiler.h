// Per-block profiles: what each block of a model costs on one backend (time, memory, bytes
// crossing a cut), and a node's live view of them, rescaled by what its segments really take.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cleave/core/model.h"
#include "cleave/core/optimizer.h"

namespace cleave::split {

struct block_profile {
  double forward_seconds = 0, backward_seconds = 0;  // one micro-batch of `batch` samples
  std::uint64_t param_bytes = 0;                     // parameters + buffers (f32)
  std::uint64_t state_bytes = 0;                     // gradients + optimizer state of those parameters
  std::uint64_t saved_bytes = 0;                     // per sample: what forward keeps for backward (children included)
  std::uint64_t output_bytes = 0;                    // per sample: the block's output (f32)
};

struct profile_options {
  int batch = 32;  // samples of the timed micro-batch
  int warmup = 2;  // untimed runs first (JIT, caches)
  int reps = 5;    // timed runs; the fastest is kept
  std::uint64_t seed = 1;
  // Seconds on a monotonic clock, read before and after each timed call (empty: steady_clock).
  std::function<double()> clock;
  // Bytes a block may take while it is timed (0: unlimited). A block whose least_segment_bytes
  // exceed it is not run: its sizes come from the spec, its times from its FLOPs at the rate
  // the measured blocks ran (0 when none was measured). A plan never hosts it here anyway.
  std::uint64_t memory_budget = 0;
};

// The least memory blocks [begin, end) of m take to train a micro-batch of `batch` samples:
// parameters and buffers, gradients and optimizer state, the segment's input and every block's
// output (what backward keeps at the very least). Known from the spec alone, before anything
// is allocated; saturates at the largest value.
std::uint64_t least_segment_bytes(const core::model_spec& m, int begin, int end, const core::optimizer_config& opt,
                                  int batch);

// Times every block of m alone on backend b: a one-block stage per block, random inputs of the
// block's input shape, forward in train mode then backward (with the input gradient, except for
// block 0), synchronising the backend around each timed call; of `reps` runs after `warmup`
// untimed ones, the fastest forward and the fastest backward are kept. The minimum, not the
// median: noise only ever adds time (other processes, interrupts, frequency drops), so the
// fastest run is the least disturbed one, the usual choice for microbenchmarks. Agents that
// profile together on one machine inflated every run but the fastest by up to 40x, which sent
// devices to a wrong plan. Throws core::error on bad options.
std::vector<block_profile> profile_blocks(core::backend& b, const core::model_spec& m,
                                          const core::optimizer_config& opt, const profile_options& o = {});

// The memory a node's blocks may use when no budget is given: half of the machine's RAM.
std::uint64_t default_memory_budget();

// Exponentially weighted moving average that drops its first `warmup` samples (the first steps
// after a change pay for allocation and JIT).
class ewma {
 public:
  // 0 < alpha <= 1 (the weight of each new sample), warmup >= 0; throws core::error otherwise.
  explicit ewma(double alpha = 0.3, int warmup = 2);

  void add(double x);
  // Whether at least one sample past the warm-up has been added.
  bool ready() const { return n_ > warmup_; }
  // The average of the kept samples; 0 until ready().
  double value() const { return value_; }
  // Samples added since construction or reset(), dropped ones included.
  int n_samples() const { return n_; }
  void reset();

 private:
  double alpha_;
  int warmup_;
  int n_ = 0;
  double value_ = 0;
};

// A node's live view of its blocks: the profiled per-block times, rescaled by what whole
// segments really take while training.
class live_profile {
 public:
  live_profile() = default;
  // alpha and warmup configure the average of each observed segment (see ewma).
  explicit live_profile(std::vector<block_profile> base, double alpha = 0.3, int warmup = 2);

  // One measured step (forward + backward of all micro-batches) of blocks [begin, end) took
  // `seconds`; base times are for one micro-batch, so a step of n_micro_batches is
  // n_micro_batches x their sum. Empty segments are ignored; a bad range, count or time throws.
  void observe(int begin, int end, double seconds, int n_micro_batches);

  // Per-block seconds of one whole step (forward + backward of n_micro_batches): the base times
  // x n_micro_batches x scale_of(block).
  std::vector<double> step_seconds(int n_micro_batches) const;

  const std::vector<block_profile>& base() const { return base_; }
  int n_blocks() const { return static_cast<int>(base_.size()); }

  // Measured / profiled time of the segment that covers `block` (the most recently observed one
  // past its warm-up); for a block no such segment covers, that of the nearest one; 1 if none.
  double scale_of(int block) const;

 private:
  struct segment {
    int begin = 0, end = 0;
    ewma per_micro_batch;     // measured seconds of one micro-batch through the segment
    double base_seconds = 0;  // profiled seconds of the same
    std::uint64_t last_seen = 0;
  };
  std::vector<block_profile> base_;
  double alpha_ = 0.3;
  int warmup_ = 2;
  std::vector<segment> segments_;
  std::uint64_t n_observed_ = 0;
};

// One end's measurement of its link to node `peer_id` (the server is 0).
struct link_sample {
  std::uint32_t peer_id = 0;
  float rtt_us = 0;
  float bandwidth_bytes_per_s = 0;  // 0: not measured yet
};

// What a node reports of itself to the planner: its blocks' costs on its backend, its memory
// budget and its links.
struct node_profile {
  std::uint32_t node_id = 0;
  std::uint32_t batch = 0;  // samples of the timed micro-batch
  std::string backend;
  std::uint64_t memory_budget_bytes = 0;
  std::vector<block_profile> blocks;  // index = block
  std::vector<link_sample> links;
};
// A node's profile now: its profiled blocks with times rescaled by what its segments measured.
node_profile current_profile(const live_profile& lp, std::uint32_t node_id, std::uint32_t batch,
                             std::string_view backend, std::uint64_t memory_budget);

}  // namespace cleave::split
