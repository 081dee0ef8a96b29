// The interface an app implements to feed its own samples (sensor windows, camera frames) to a
// trainer, a device agent or a server's evaluation, and a view of some of a source's samples.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cleave/core/augment.h"
#include "cleave/core/shape.h"

namespace cleave::core {

// A fixed, indexable set of labelled samples of one shape. Its const calls may come from several
// threads at once (the agents of one process sharing a source), so they must not change shared
// state unguarded; and they must give the same values for the same index every time: the
// order, the shards and the split = local equivalence all rest on that.
class data_source {
 public:
  virtual ~data_source() = default;

  // Number of samples, indexed [0, size()).
  virtual std::int64_t size() const = 0;
  // Shape of one sample, (C,H,W): e.g. (1,28,28) for a grey image, (3,1,T) for T readings of
  // a 3-axis sensor.
  virtual shape sample_shape() const = 0;
  // Labels lie in [0, class_count()).
  virtual int class_count() const = 0;
  // Every sample's label, size() of them: what non-IID partitions split by.
  virtual std::vector<std::int32_t> labels() const = 0;
  // Samples idx[0, n) into x_out (n, C,H,W) and their labels into y_out (n). Indices are in range.
  virtual void fetch(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out) const = 0;
  // As fetch, each sample augmented as `a` says with the draws of (seed, epoch, idx[i]). The
  // default fetches plainly when nothing is enabled and otherwise throws core::error: a source
  // that can augment overrides it.
  virtual void fetch_augmented(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out,
                               const augment_config& a, std::uint64_t seed, std::int64_t epoch) const;
  // What the logs call it.
  virtual std::string describe() const { return "data source"; }
  // How a raw input becomes one of these samples, for the users of a model trained on them: the
  // metadata an exported model carries, text by name ("input_mean", "input_std": JSON arrays of
  // the per-channel mean and standard deviation the pixel values, scaled to [0,1], are
  // normalised with). None when the source does not say.
  virtual std::map<std::string, std::string> input_normalisation() const { return {}; }
};

// Checks what a source says of itself (a positive shape of 3 dims, classes >= 1, labels in
// range and as many as samples); throws core::error naming the source and the fault.
void check_source(const data_source& s);

// The samples idx of `s`, in that order. A core::dataset is copied (dataset::subset: its
// augmentation draws then follow the index in the subset); any other source is viewed, keeping
// `s` alive, and its augmentation draws follow the index in `s`. An index out of range throws
// core::error.
std::shared_ptr<const data_source> subset_of(std::shared_ptr<const data_source> s, std::vector<std::int64_t> idx);

}  // namespace cleave::core
