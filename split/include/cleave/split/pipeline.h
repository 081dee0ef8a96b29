// The compute side of a split-learning node: the segments of device routes that this node
// runs. An activation from below is run forward and passed up, or, where the route ends, into
// the loss and straight back; a gradient from above is run backward and passed down. When all
// micro-batches of a step have gone back through a segment, its optimizer steps. No I/O here:
// the device agent, edge relay and server wrap it with channels.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "cleave/core/optimizer.h"
#include "cleave/core/stage.h"
#include "cleave/split/plan.h"

namespace cleave::split {

struct micro_batch_id {
  std::uint64_t step = 0;
  std::uint32_t micro_batch = 0;
  friend auto operator<=>(const micro_batch_id&, const micro_batch_id&) = default;
};

// What a segment hands on.
struct segment_output {
  enum class direction : std::uint8_t { up, down, none } dir = direction::none;
  core::tensor value;  // activation going up or gradient going down
  float loss = 0.0f;   // where the loss was computed: this micro-batch's mean loss
  std::uint32_t n_correct = 0;
  bool stepped = false;  // the segment's optimizer stepped (all micro-batches of the step are back)
};

// The state of blocks [begin, end) of one device's route, on the host: what moves when a cut
// moves. Slices in the model's flat layout (see layout_of).
struct block_state {
  int begin = 0, end = 0;
  std::vector<float> params, buffers;               // (P[begin,end)), (S[begin,end))
  std::vector<std::vector<float>> optimizer_state;  // each (P[begin,end))
  std::int64_t optimizer_steps = 0;
};

class segment_host {
 public:
  segment_host(core::backend& b, const core::model_spec& m, const core::optimizer_config& opt, std::uint64_t seed);

  // Hosts segment `segment` of `device`'s route. With `shared` set, devices hosting the same
  // block range share one stage and optimizer (sequential split learning) instead of one
  // replica each (SplitFed-v1).
  void host(std::uint32_t device, const route& r, int segment, bool shared = false);
  void drop_device(std::uint32_t device);
  bool hosts(std::uint32_t device, int segment) const;
  // Hosts that segment under route r (not another route's).
  bool hosts(std::uint32_t device, const route& r, int segment) const;

  // x (B, in...) arriving for (device, segment). labels (B) i32 are needed where the loss is
  // computed here. micro_batch_scale is this micro-batch's share of the step's batch (the
  // loss of a step is the mean over its whole batch).
  segment_output forward(std::uint32_t device, int segment, micro_batch_id id, const core::tensor& x,
                         const core::tensor& labels, float micro_batch_scale, std::uint32_t n_micro_batches,
                         std::uint32_t dropout_seed = 0);
  // dy (B, out...) arriving for a segment that sent its activation up.
  segment_output backward(std::uint32_t device, int segment, micro_batch_id id, const core::tensor& dy);

  // Moves `device` from route `from` to route `to` on tier `here`, at a step boundary (nothing of
  // the device in flight). Blocks that stay on this tier keep their weights and optimizer state;
  // the state of blocks that leave it is returned (maximal contiguous ranges); blocks that
  // arrive stay missing until install_blocks() brings them (it may also come first).
  std::vector<block_state> rehost(std::uint32_t device, const route& from, const route& to, core::tier here);
  // Blocks of `device` arriving from another tier.
  void install_blocks(std::uint32_t device, block_state s);
  // Blocks of device's route expected here and not yet installed.
  int n_missing(std::uint32_t device) const;

  // The stage (and optimizer) of a hosted segment.
  core::stage& stage_of(std::uint32_t device, int segment);
  core::optimizer& optimizer_of(std::uint32_t device, int segment);
  // The base learning rate of every segment of `device` hosted here, now and when re-hosted
  // (a federation's per-round schedule).
  void set_learning_rate(std::uint32_t device, float lr);

  // Forgets micro-batches in flight (a device left, or its round was closed).
  void discard_pending(std::uint32_t device);
  std::size_t n_pending() const;

  core::backend& device_backend() const { return *b_; }
  const core::model_spec& model() const { return *m_; }

 private:
  struct replica {
    std::unique_ptr<core::stage> st;
    std::unique_ptr<core::optimizer> opt;
  };
  struct gathered;
  gathered gather(std::uint32_t device, const route& from, core::tier here) const;
  std::vector<block_state> leaving(const gathered& g, const route& to, core::tier here) const;
  // Loads the gathered state of the blocks it holds into a new segment's replica.
  void seed_segment(replica& rep, const gathered& g);

  struct slot {
    route r;
    int segment = 0;
    std::shared_ptr<replica> rep;
    struct in_flight {
      core::stage::context ctx;
      core::shape out;  // the activation sent up
    };
    std::map<micro_batch_id, in_flight> pending;
    std::map<std::uint64_t, std::uint32_t> done;  // step -> micro-batches back through here
  };
  slot& at(std::uint32_t device, int segment);
  bool finish_micro_batch(slot& s, micro_batch_id id, std::uint32_t n_micro_batches);

  core::backend* b_;
  const core::model_spec* m_;
  core::optimizer_config opt_;
  std::uint64_t seed_;
  std::map<std::pair<std::uint32_t, int>, slot> slots_;
  std::map<std::pair<int, int>, std::shared_ptr<replica>> shared_;  // block range -> replica
  std::map<std::pair<std::uint32_t, int>, std::uint32_t> n_mb_;     // micro-batches per step
  struct arrival {
    std::set<int> missing;           // blocks still to come
    std::vector<block_state> early;  // arrived before the re-host
  };
  std::map<std::uint32_t, arrival> arrivals_;
  std::map<std::uint32_t, float> lr_;  // set_learning_rate, per device
  void apply(std::uint32_t device, const block_state& s);
};

}  // namespace cleave::split
