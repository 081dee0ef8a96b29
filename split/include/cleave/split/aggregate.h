// Weighted averaging of block replicas (SplitFed): every replica of every block, weighted by
// the samples it saw. Weighted means combine associatively, so an edge relay can pre-average
// its devices and pass one (mean, weight) per block upstream.
#pragma once

#include <span>
#include <vector>

#include "cleave/core/model.h"

namespace cleave::split {

class model_average {
 public:
  explicit model_average(const core::model_spec& m);

  // Adds a replica of blocks [first, end): params and buffers are those blocks' flat slices
  // (stage layout), weight the number of samples behind it (> 0).
  void add(int first, int end, double weight, std::span<const float> params, std::span<const float> buffers);
  // Throws core::error unless a replica of blocks [first, end) with these value counts and weight
  // fits the model (what add checks first).
  void check_fits(int first, int end, double weight, std::size_t n_params, std::size_t n_buffers) const;
  void clear();

  double weight(int block) const { return weight_[static_cast<std::size_t>(block)]; }
  bool covers_all() const;

  // Maximal runs of blocks with the same non-zero weight: what an edge sends upstream.
  struct run {
    int first, end;
    double weight;
  };
  std::vector<run> runs() const;

  // The weighted mean of blocks [first, end), which must all have weight > 0.
  void mean(int first, int end, std::vector<float>& params, std::vector<float>& buffers) const;
  // The whole model; blocks nobody uploaded keep the values already in params / buffers
  // (sized to the whole model).
  void mean_into(std::vector<float>& params, std::vector<float>& buffers) const;

  const core::flat_layout& layout() const { return layout_; }

 private:
  core::flat_layout layout_;
  std::vector<double> weight_;            // per block
  std::vector<double> params_, buffers_;  // weighted sums, whole model
};

}  // namespace cleave::split
