// Defences of what a device sends up at its bottom cut, and a check of what comes back down.
// Each works on one micro-batch as rows: n samples of d values, row-major, on the host.
//  - Clipping and Gaussian noise: every sample's activation is scaled to L2 norm at most C, then
//    noise of standard deviation sigma * C is added to every value. Two inputs' clipped
//    activations differ by at most 2C, so one release is the Gaussian mechanism with noise
//    multiplier sigma / 2 on that input; rdp_accountant composes the releases of a round.
//  - NoPeek (Vepakomma et al., 2020): the distance correlation between a micro-batch's inputs and
//    its activations, a term of the device's loss that makes activations carry less of the input.
//  - A label-alignment check of the gradients a device receives: an honest server's gradients
//    follow the labels (same-label samples point alike); a server steering the device's features
//    into a space of its own (FSHA, Pasquini et al., CCS'21) sends gradients that do not.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace cleave::privacy {

// Scales each row of v (n x d) to L2 norm at most `clip` (> 0) in place; returns each row's
// scale (1 where it was within the bound).
std::vector<float> clip_rows(std::span<float> v, std::int64_t n, double clip);
// The gradient through clip_rows: g (n x d), the gradient of the clipped rows, becomes the
// gradient of the rows before clipping. `clipped` are the rows after clipping (before any noise),
// `scale` what clip_rows returned.
void clip_rows_backward(std::span<float> g, std::span<const float> clipped, std::span<const float> scale,
                        std::int64_t n, double clip);

// Distance correlation between the rows of x (n x dx) and of z (n x dz), in [0, 1] (0 when
// either side has no spread). With grad_z (n x dz), also its gradient with respect to z
// (written, not added). n >= 2.
double distance_correlation(std::span<const float> x, std::int64_t dx, std::span<const float> z, std::int64_t dz,
                            std::int64_t n, std::span<float> grad_z = {});

// The label alignment of a micro-batch's gradients: the mean cosine between rows of g (n x d)
// with the same label minus the mean cosine between rows with different labels. NaN when either
// kind of pair is missing (rows of zero norm are left out).
double label_alignment(std::span<const float> g, std::int64_t n, std::span<const std::int32_t> labels);

// Renyi differential privacy of repeated Gaussian mechanisms (Mironov, 2017), converted to
// (epsilon, delta) with the bound of Balle et al. (2020), minimised over a fixed set of orders.
class rdp_accountant {
 public:
  // `count` releases, each the Gaussian mechanism with noise multiplier z = std / L2 sensitivity.
  void add_gaussian(double noise_multiplier, std::uint64_t count = 1);
  // The epsilon of everything added so far at this delta (0 < delta < 1); 0 before any release,
  // infinity when a release had no noise.
  double epsilon(double delta) const;
  static std::span<const double> orders();

 private:
  std::vector<double> rdp_ = std::vector<double>(orders().size(), 0.0);
  std::uint64_t releases_ = 0;
};

// Running statistics of label_alignment over micro-batches: suspicious once `window` micro-batches
// were seen and the mean over the last `window` is below `threshold`.
class gradient_monitor {
 public:
  gradient_monitor(int window, double threshold) : window_(window < 1 ? 1 : window), threshold_(threshold) {}
  // Adds one micro-batch's alignment (NaN ones are skipped).
  void add(double alignment);
  bool ready() const { return static_cast<int>(last_.size()) >= window_; }
  double mean() const;  // over the last `window` (NaN before any)
  bool suspicious() const { return ready() && mean() < threshold_; }
  double threshold() const { return threshold_; }
  int window() const { return window_; }

 private:
  int window_;
  double threshold_;
  std::vector<double> last_;  // a ring of the last `window`
  std::size_t next_ = 0;
};

}  // namespace cleave::privacy
