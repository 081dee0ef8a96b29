// The defences of a device as cut filters (cut_filter.h) on the primitives of cut_defence.h, and the
// chain of them a device installs from its settings.
//
// At the bottom cut: NoPeek, clipping with Gaussian noise, the gradient check, and (tests of
// hostile servers only) a hook on the gradients that come back. At a gradient leaving the device's
// own loss (U-shaped plans): label defences, equalised norms and max-norm noise. Noise is drawn
// from (seed, device, step, micro-batch) (core/micro_batch_seed.h): runs repeat exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "cleave/privacy/cut_defence.h"
#include "cleave/privacy/cut_filter.h"

namespace cleave::privacy {

// NoPeek: `weight` times the distance correlation of a micro-batch's inputs and its output joins
// the device's loss (its gradient is added to the one that comes back). Micro-batches of one row
// have none.
class nopeek_filter : public cut_filter {
 public:
  explicit nopeek_filter(double weight) : weight_(weight) {}
  void output(departure& d, crossing& o) override;
  void gradient(const micro_batch_key& k, crossing& g) override;
  void discard(std::uint32_t device) override;
  // Since the last call: the distance correlations measured (their sum and count).
  std::pair<double, std::uint64_t> take() { return {std::exchange(sum_, 0.0), std::exchange(n_, 0)}; }

 private:
  double weight_;
  std::map<micro_batch_key, std::vector<float>> grad_;
  double sum_ = 0;
  std::uint64_t n_ = 0;
};

// Each sample's output clipped to L2 norm `clip` (> 0), then Gaussian noise of standard deviation
// noise * clip added to every value (none when noise is 0). The gradient passes back through the
// clipping exactly, and around the noise.
class clip_filter : public cut_filter {
 public:
  clip_filter(double clip, double noise, std::uint64_t seed) : clip_(clip), noise_(noise), seed_(seed) {}
  void output(departure& d, crossing& o) override;
  void gradient(const micro_batch_key& k, crossing& g) override;
  void discard(std::uint32_t device) override;

 private:
  struct kept {
    std::vector<float> clipped, scale;
  };
  double clip_, noise_;
  std::uint64_t seed_;
  std::map<micro_batch_key, kept> kept_;
};

// The label alignment (label_alignment) of the gradients that come back, against the targets the
// micro-batch was trained on (its sub-classes under label groups), over the last `window` scored
// micro-batches: each until the window is full, then every stride-th.
class gradient_check_filter : public cut_filter {
 public:
  static constexpr std::uint64_t stride = 4;
  gradient_check_filter(int window, double threshold) : monitor_(window, threshold) {}
  void output(departure& d, crossing& o) override;
  void gradient(const micro_batch_key& k, crossing& g) override;
  void discard(std::uint32_t device) override;
  const gradient_monitor& monitor() const { return monitor_; }

 private:
  gradient_monitor monitor_;
  std::uint64_t checked_ = 0;
  std::map<micro_batch_key, std::vector<std::int32_t>> labels_;
};

// For tests of hostile servers only: changes every gradient that comes back (n rows), given the
// output as it left for it, before any other filter sees it.
using gradient_hook = std::function<void(std::vector<float>& gradient, const std::vector<float>& sent, std::int64_t n)>;
class gradient_hook_filter : public cut_filter {
 public:
  explicit gradient_hook_filter(gradient_hook h) : hook_(std::move(h)) {}
  void output(departure& d, crossing& o) override;
  void gradient(const micro_batch_key& k, crossing& g) override;
  void discard(std::uint32_t device) override;

 private:
  gradient_hook hook_;
  std::map<micro_batch_key, std::vector<float>> sent_;
};

// Each sample's loss gradient rescaled to the micro-batch's root-mean-square norm (a sample whose
// gradient is 0 keeps it), so that norms carry nothing of the labels. With label groups
// (core::with_label_groups) every sample's gradient keeps a share of its own, and training stays
// close to the plain one.
class label_equalise_filter : public cut_filter {
 public:
  void loss_gradient(const micro_batch_key& k, crossing& g) override;
};

// Isotropic Gaussian noise added to each sample's loss gradient, of total expected energy s^2 times
// the gap between the micro-batch's largest squared norm and the sample's own (s = 1: every
// sample's expected squared norm is the largest, Li et al.'s max-norm; s < 1 less, s > 1 more,
// hiding directions too). s >= 0.
class label_noise_filter : public cut_filter {
 public:
  label_noise_filter(double s, std::uint64_t seed) : s_(s), seed_(seed) {}
  void loss_gradient(const micro_batch_key& k, crossing& g) override;

 private:
  double s_;
  std::uint64_t seed_;
};

// A device's defences as its settings give them; each is off at its default.
struct device_defences {
  double activation_clip = 0;   // clip_filter's bound (0: off)
  double activation_noise = 0;  // clip_filter's noise
  double nopeek = 0;            // nopeek_filter's weight (0: off)
  double gradient_noise = -1;   // label_noise_filter's s (negative: off)
  bool equalise = false;        // label_equalise_filter
  int check_window = 0;         // gradient_check_filter's window (0: off)
  double check_threshold = 0.1;
  std::uint64_t seed = 0;  // of the noise streams
  gradient_hook hook;      // gradient_hook_filter (tests only)
};
// The chain of them in the order they compose: outputs through NoPeek (on what the segment
// produced), clipping and noise, the check and the hook (what left); gradients back the other way;
// loss gradients equalised, then noised.
filter_chain device_filters(const device_defences& d);

}  // namespace cleave::privacy
