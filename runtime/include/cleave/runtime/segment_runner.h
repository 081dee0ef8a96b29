// The compute side every node shares: the segments of device routes hosted on this tier, run
// from step messages (decode -> forward/backward -> observe the live profile -> encode for the
// next hop), migrations at re-splits, block profiles, and work held until migrated blocks are
// in. Used on the node's compute thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <semaphore>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cleave/privacy/cut_filter.h"
#include "cleave/protocol/protocol.h"
#include "cleave/runtime/route_state.h"
#include "cleave/split/pipeline.h"
#include "cleave/split/profiler.h"

namespace cleave::runtime {

// What a step message did here.
struct step_result {
  std::optional<transport::message_builder> out;  // the next hop's message (none: it ended here)
  core::tier to = core::tier::server;             // the tier that runs the next hop
  bool loss_here = false;                         // this node computed the micro-batch's loss
  double loss = 0;                                // computed here, or carried down by a gradient
  std::uint32_t n_correct = 0;
  std::int64_t n_samples = 0;
  bool stepped = false;  // a segment finished a whole step here (its optimizer stepped)
};

// What the nodes of one process that stand for one kind of board (virtual devices) share: their
// block profiles (the first to profile a model at a batch size measures it, the others take its
// figures, each with its own slowdown) and the cores: at most `slots` of them compute at once, so
// that hundreds of device threads do not starve the I/O threads (theirs, and those of a server on
// the same machine) of the CPU.
class shared_board {
 public:
  explicit shared_board(int slots) : slots_(std::max(1, slots)) {}
  std::vector<split::block_profile> profile(const std::string& key,
                                            const std::function<std::vector<split::block_profile>()>& measure,
                                            bool& measured);  // whether this call measured
  void acquire() { slots_.acquire(); }
  void release() { slots_.release(); }

 private:
  std::mutex mu_;
  std::map<std::string, std::vector<split::block_profile>> done_;
  std::counting_semaphore<1 << 16> slots_;
};

class segment_runner {
 public:
  segment_runner(core::backend& b, core::tier here, std::uint32_t node_id, double slowdown = 1.0);

  // The model and settings of a plan; a different model starts a new host (every hosted
  // segment goes). Throws core::error on a bad spec. Returns whether it changed.
  bool set_model(const std::string& json, const protocol::training_settings& t);
  bool has_model() const { return host_ != nullptr; }
  const core::model_spec& model() const { return model_; }
  split::segment_host& host() { return *host_; }
  core::backend& backend() { return *b_; }
  void set_slowdown(double s) { slowdown_ = s; }
  void share_board(std::shared_ptr<shared_board> b) { shared_ = std::move(b); }
  // How device's activations and gradients leave this node, hop by hop (its plan's cut
  // settings); f32 until set. A step message says how it is encoded, so only senders need this.
  void set_cut(std::uint32_t device, protocol::cut_settings c);
  // The filters of what crosses this node's cuts (privacy/cut_filter.h): a device's bottom-cut
  // output as it leaves and its gradient as it comes back, and every gradient leaving a loss
  // computed here. None until set.
  void set_filters(privacy::filter_chain f) { filters_ = std::move(f); }
  privacy::filter_chain& filters() { return filters_; }

  // A step message (Activations or Gradients) of `device` under route r (plan epoch `epoch`)
  // that came from tier `from` into a segment on this tier; what it sends on keeps the message's
  // attempt at the round. `labels` (B) i32: a U-shaped top
  // on the device, whose labels never travelled. Throws core::error naming what does not fit.
  step_result run(std::uint32_t device, const split::route& r, std::uint32_t epoch, core::tier from,
                  const transport::message& m, const core::tensor* labels = nullptr);
  // The bottom of a device's route: inputs x (B, ...) and labels y (B) i32 of micro-batch id, in
  // attempt `attempt` at its round. `host_y`: the same labels on the host where the caller has
  // them (saves the gradient check a download).
  step_result run_input(std::uint32_t device, const split::route& r, std::uint32_t epoch, std::uint32_t attempt,
                        split::micro_batch_id id, const core::tensor& x, const core::tensor& y,
                        const protocol::batch_info& bi, std::span<const std::int32_t> host_y = {});

  // Work for `device` runs now, or once the blocks migrating here for it are all in (in order).
  void submit(std::uint32_t device, std::function<void()> task);
  // The device's steps in flight are void (it left, or its round closed); with `segments`,
  // its segments go too (it joined again and gets a new plan).
  void discard(std::uint32_t device, bool segments = false);

  // A re-split at a step boundary: this tier's part of moving `device` from route `from` to `to`.
  // Returns the Migrate messages of the blocks leaving, each with the tier it goes to; with
  // `fresh_optimizer` their optimizer state goes as zeros (a device's, under secure aggregation).
  std::vector<std::pair<core::tier, transport::message_builder>> rehost(std::uint32_t device, const split::route& from,
                                                                        const split::route& to,
                                                                        const protocol::migrate_desc& md,
                                                                        bool fresh_optimizer = false);
  // Blocks arriving for `device`; then runs its held work if nothing is missing any more.
  void install(std::uint32_t device, const wire::Migrate& m);

  // Hosts the segments of r on this tier (if not yet) and loads whole-model weights into them.
  void load(std::uint32_t device, const split::route& r, std::span<const float> params, std::span<const float> buffers,
            bool shared = false);
  // The replicas of device's segments here, blocks [first, end) with their flat values; `seen`
  // skips block ranges already taken (one shared replica in sequential mode). A replica holding
  // a non-finite value (trained on NaN activations or gradients the device sent) is left out,
  // with a warning.
  struct replica {
    int first, end;
    std::vector<float> params, buffers;
  };
  std::vector<replica> replicas(std::uint32_t device, const split::route& r,
                                std::set<std::pair<int, int>>* seen = nullptr);

  // The optimizer state of device's segments here under route r (per segment: its blocks, state
  // tensors and steps taken), and putting it back: what a checkpoint keeps, and what a round run
  // again (the server resumed from its checkpoint) starts from.
  struct optimizer_state {
    int first = 0, end = 0;
    std::vector<std::vector<float>> tensors;
    std::int64_t steps = 0;
  };
  std::vector<optimizer_state> optimizer_states(std::uint32_t device, const split::route& r);
  // Throws core::error when a state does not match a hosted segment.
  void restore_optimizer(std::uint32_t device, const split::route& r, const std::vector<optimizer_state>& states);

  // Times every block on this backend (x the slowdown) for micro-batches of `batch`; a block
  // that would take more than memory_budget bytes is priced from the spec, not run (see
  // split::profile_options).
  void profile(std::uint32_t batch, const protocol::training_settings& t, std::uint64_t memory_budget);
  bool profiled() const { return live_.n_blocks() > 0; }
  // Times the blocks again when none ran here since the last call: plans must not rest on the
  // figures of the start whatever the load has become. True when it did.
  bool reprofile_if_idle();
  split::node_profile snapshot(std::uint64_t memory_budget) const;
  // Compute seconds (x the slowdown) since the last call.
  double take_compute_seconds();

 private:
  int segment_at(const split::route& r, std::uint32_t block, core::tier from, bool activation) const;
  step_result finish(std::uint32_t device, const split::route& r, std::uint32_t epoch, std::uint32_t attempt, int seg,
                     split::micro_batch_id id, const protocol::batch_info& bi, split::segment_output o,
                     const core::tensor& labels, double seconds, bool forward);
  double timed(const std::function<void()>& f);
  void release(std::uint32_t device);

  core::backend* b_;
  core::tier here_;
  std::uint32_t node_id_;
  double slowdown_;
  std::shared_ptr<shared_board> shared_;
  std::string model_json_;
  core::model_spec model_;
  protocol::training_settings training_;
  std::unique_ptr<split::segment_host> host_;
  std::map<std::uint32_t, std::vector<std::function<void()>>> held_;
  split::live_profile live_;
  std::uint32_t profile_batch_ = 0;
  std::uint64_t profile_budget_ = 0;
  std::map<std::pair<std::uint32_t, int>, double> seg_seconds_;  // this step's compute per segment
  std::map<std::uint32_t, protocol::batch_info> batch_;          // per device: its step's shape
  std::map<std::uint32_t, protocol::cut_settings> cut_;          // per device: its hops' codecs
  // topk's error feedback per gradient stream: (device, segment, micro-batch).
  std::map<std::tuple<std::uint32_t, int, std::uint32_t>, std::vector<float>> residual_;
  int n_observed_ = 0, n_observed_mark_ = 0;
  double compute_s_ = 0;
  privacy::filter_chain filters_;
};

}  // namespace cleave::runtime
