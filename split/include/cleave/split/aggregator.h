// How a round's replicas of each block become the global block: the weighted mean of SplitFed,
// or a rule that one hostile replica cannot drag far (coordinate-wise median or trimmed mean, or
// a weighted mean of updates clipped in norm).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cleave/core/model.h"
#include "cleave/split/aggregate.h"

namespace cleave::split {

enum class aggregate_kind : std::uint8_t {
  mean,          // weighted by samples: model_average, exactly
  median,        // per coordinate over the replicas of the block, weights ignored
  trimmed_mean,  // per coordinate: floor(fraction * n) largest and smallest dropped, mean of the rest
  clip,          // each replica's update scaled to an L2 norm <= clip_norm, then the weighted mean
};

struct aggregate_rule {
  aggregate_kind kind = aggregate_kind::mean;
  double fraction = 0;   // trimmed_mean: 0 <= fraction < 0.5
  double clip_norm = 0;  // clip: > 0
  // Every rule but the mean needs each device's own replicas: a pre-averaged one would hide an
  // outlier inside the average before the rule sees it.
  bool per_device() const { return kind != aggregate_kind::mean; }
};

// "mean", "median", "trimmed-mean:F" or "clip:C"; throws core::error saying what is wrong.
aggregate_rule parse_aggregate(const std::string& text);
// The text parse_aggregate reads back.
std::string aggregate_name(const aggregate_rule& r);
// Throws core::error unless the rule's number is in range and finite.
void check_rule(const aggregate_rule& r);

// The replicas of one round, combined by a rule. Replicas are added as for model_average; blocks
// nobody uploaded keep the values already in the caller's vectors.
class aggregator {
 public:
  // start_params / start_buffers: the round's starting global model (whole-model flat layout),
  // the reference of clip's updates (unused by the other rules, may be empty there).
  aggregator(const core::model_spec& m, const aggregate_rule& rule, std::span<const float> start_params = {},
             std::span<const float> start_buffers = {});

  // A replica of blocks [first, end) (stage layout slices), weight the samples behind it (> 0).
  // Throws core::error when it does not fit the model.
  void add(int first, int end, double weight, std::span<const float> params, std::span<const float> buffers);

  const aggregate_rule& rule() const { return rule_; }
  double weight(int block) const { return sums_.weight(block); }
  int n_replicas(int block) const { return count_[static_cast<std::size_t>(block)]; }
  // The aggregate of every block that has a replica, written into params / buffers (sized to the
  // whole model).
  void result_into(std::vector<float>& params, std::vector<float>& buffers) const;

 private:
  struct replica {
    int first, end;
    std::vector<float> params, buffers;
  };
  // The median or trimmed mean of one coordinate's values (reordered).
  float robust_value(std::vector<float>& v) const;

  aggregate_rule rule_;
  model_average sums_;                    // mean and clip
  std::vector<float> start_p_, start_b_;  // clip
  std::vector<replica> kept_;             // median and trimmed mean
  std::vector<int> count_;                // replicas per block
};

}  // namespace cleave::split
