// Filters of what crosses a cut: the interface the segment runner calls at three points (an output
// leaving a device's bottom cut, its gradient coming back, a gradient leaving a loss) and the chain.
//
// A node installs the filters it needs (a device: its defences, see cut_filters.h) and the runner
// calls them wherever a route crosses those points, whatever the tier. Filters see a tensor as
// rows: n samples of d values. Its values come to the host once, when a filter first reads them,
// and go back once, after the chain, when a filter changed them.
#pragma once

#include <compare>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cleave/core/backend.h"

namespace cleave::privacy {

// Whose micro-batch crosses: micro-batch `micro_batch` of `device`'s step `step`.
struct micro_batch_key {
  std::uint32_t device = 0;
  std::uint64_t step = 0;
  std::uint32_t micro_batch = 0;
  friend auto operator<=>(const micro_batch_key&, const micro_batch_key&) = default;
};

// A tensor t (B, ...) crossing a cut, as B rows of numel / B values.
class crossing {
 public:
  crossing(core::backend& b, const core::tensor& t);
  std::int64_t rows() const { return n_; }
  std::int64_t width() const { return d_; }
  std::span<const float> values();  // (rows x width), on the host
  std::span<float> edit();          // the same, to change
  bool changed() const { return changed_; }
  // t itself when no filter changed it, else a new tensor of its shape with the changed values
  // (the segment that produced t may keep it for its backward pass).
  core::tensor result() const;

 private:
  core::backend* b_;
  core::tensor t_;
  std::int64_t n_ = 0, d_ = 0;
  std::vector<float> v_;
  bool loaded_ = false, changed_ = false;
};

// What else a filter may read of a micro-batch leaving a device's bottom cut: its inputs and labels
// (on the host when first asked for), and its place in the step.
class departure {
 public:
  // x (B, ...) f32 and y (B) i32 on b; host_y: y on the host where the caller has it (or empty).
  departure(core::backend& b, micro_batch_key key, const core::tensor& x, const core::tensor& y,
            std::span<const std::int32_t> host_y, std::uint32_t batch_size, int label_groups);
  const micro_batch_key& key() const { return key_; }
  std::uint32_t batch_size() const { return batch_size_; }  // samples in the whole step
  int label_groups() const { return label_groups_; }        // core::model_spec::label_groups
  std::span<const float> inputs();                          // x as (B x numel / B)
  std::int64_t input_width() const;
  std::span<const std::int32_t> labels();  // y (B)

 private:
  core::backend* b_;
  micro_batch_key key_;
  const core::tensor* x_;
  const core::tensor* y_;
  std::span<const std::int32_t> host_y_;
  std::uint32_t batch_size_;
  int label_groups_;
  std::vector<float> xv_;
  std::vector<std::int32_t> yv_;
};

// One filter; each hook does nothing unless overridden.
class cut_filter {
 public:
  virtual ~cut_filter() = default;
  // o (B, ...): a device's bottom-cut output as it leaves, of the micro-batch `d` describes.
  virtual void output(departure& d, crossing& o) {}
  // g (B, ...): the gradient of that output coming back, before the device's backward pass. Also
  // called when g has no rows (then a filter only forgets what it kept for k).
  virtual void gradient(const micro_batch_key& k, crossing& g) {}
  // g (B, ...): a gradient this node computed from its own loss, as it leaves downwards.
  virtual void loss_gradient(const micro_batch_key& k, crossing& g) {}
  // The device's micro-batches in flight are void: what is kept for them goes.
  virtual void discard(std::uint32_t device) {}
};

// Filters in the order added. An output passes through them in that order and its gradient in
// the reverse order (the last to change what left is the first to see what comes back, as layers
// do); a loss gradient in the order added. An output or loss gradient of no rows passes untouched.
class filter_chain {
 public:
  filter_chain& add(std::unique_ptr<cut_filter> f);
  bool empty() const { return filters_.empty(); }
  std::size_t size() const { return filters_.size(); }
  // The first filter of type F, or null.
  template <class F>
  F* find() const {
    for (const auto& f : filters_)
      if (auto* p = dynamic_cast<F*>(f.get())) return p;
    return nullptr;
  }

  // Each returns the tensor to go on with: o, dy or g itself when no filter changed it.
  core::tensor output(core::backend& b, departure& d, const core::tensor& o);
  core::tensor gradient(core::backend& b, const micro_batch_key& k, const core::tensor& dy);
  core::tensor loss_gradient(core::backend& b, const micro_batch_key& k, const core::tensor& g);
  void discard(std::uint32_t device);

 private:
  std::vector<std::unique_ptr<cut_filter>> filters_;
};

}  // namespace cleave::privacy
