// A device's defences as cut filters: what each does to what leaves, and to the gradient that
// comes back for it.
#include "cleave/privacy/cut_filters.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "cleave/core/error.h"
#include "cleave/core/micro_batch_seed.h"
#include "cleave/core/random.h"
#include "cleave/core/stage.h"

namespace cleave::privacy {

namespace {

// What a filter kept of micro-batch k when it left, taken out of `m` (null when nothing was).
template <class V>
std::optional<V> take_kept(std::map<micro_batch_key, V>& m, const micro_batch_key& k) {
  const auto it = m.find(k);
  if (it == m.end()) return std::nullopt;
  V v = std::move(it->second);
  m.erase(it);
  return v;
}

template <class V>
void forget(std::map<micro_batch_key, V>& m, std::uint32_t device) {
  std::erase_if(m, [device](const auto& kv) { return kv.first.device == device; });
}

// Squared L2 norm of each of the n rows of v (n x d).
std::vector<double> row_norms2(std::span<const float> v, std::int64_t n, std::int64_t d) {
  std::vector<double> out(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t k = 0; k < d; ++k) {
      const double x = v[static_cast<std::size_t>(i * d + k)];
      out[static_cast<std::size_t>(i)] += x * x;
    }
  return out;
}

}  // namespace

void nopeek_filter::output(departure& d, crossing& o) {
  const std::int64_t n = o.rows();
  if (n < 2) return;
  std::vector<float>& grad = grad_[d.key()];
  grad.resize(static_cast<std::size_t>(n * o.width()));
  const double r = distance_correlation(d.inputs(), d.input_width(), o.values(), o.width(), n, grad);
  sum_ += r;
  ++n_;
  // A term of the loss, which is the batch's mean: each micro-batch its share.
  const float w =
      static_cast<float>(weight_ * static_cast<double>(n) / static_cast<double>(std::max(1u, d.batch_size())));
  for (float& gv : grad) gv *= w;
}

void nopeek_filter::gradient(const micro_batch_key& k, crossing& g) {
  const auto grad = take_kept(grad_, k);
  if (!grad || g.rows() <= 0 || grad->size() != g.values().size()) return;
  const std::span<float> v = g.edit();
  for (std::size_t i = 0; i < v.size(); ++i) v[i] += (*grad)[i];
}

void nopeek_filter::discard(std::uint32_t device) {
  forget(grad_, device);
}

void clip_filter::output(departure& d, crossing& o) {
  const std::span<float> v = o.edit();
  kept& st = kept_[d.key()];
  st.scale = clip_rows(v, o.rows(), clip_);
  st.clipped.assign(v.begin(), v.end());
  if (noise_ > 0) {
    const micro_batch_key& k = d.key();
    core::rng r(core::micro_batch_seed(seed_, k.device, k.step, k.micro_batch, core::stream::activation_noise));
    const double sd = noise_ * clip_;
    for (float& e : v) e += static_cast<float>(sd * r.normal());
  }
}

void clip_filter::gradient(const micro_batch_key& k, crossing& g) {
  const auto st = take_kept(kept_, k);
  if (!st || g.rows() <= 0 || st->clipped.size() != g.values().size()) return;
  clip_rows_backward(g.edit(), st->clipped, st->scale, g.rows(), clip_);
}

void clip_filter::discard(std::uint32_t device) {
  forget(kept_, device);
}

void gradient_check_filter::output(departure& d, crossing& o) {
  if (monitor_.ready() && checked_++ % stride != 0) return;
  const auto y = d.labels();
  std::vector<std::int32_t>& labels = labels_[d.key()];
  labels.assign(y.begin(), y.end());
  // With label groups the gradients follow the sub-class each sample was trained on.
  if (const int groups = d.label_groups(); groups > 1) {
    const micro_batch_key& k = d.key();
    const auto seed = static_cast<std::uint32_t>(
        core::micro_batch_seed(0, k.device, k.step, k.micro_batch, core::stream::label_groups));
    core::group_targets(labels, groups, seed, labels);
  }
  (void)o;
}

void gradient_check_filter::gradient(const micro_batch_key& k, crossing& g) {
  const auto labels = take_kept(labels_, k);
  if (!labels || g.rows() <= 0 || labels->size() != static_cast<std::size_t>(g.rows())) return;
  monitor_.add(label_alignment(g.values(), g.rows(), *labels));
}

void gradient_check_filter::discard(std::uint32_t device) {
  forget(labels_, device);
}

void gradient_hook_filter::output(departure& d, crossing& o) {
  const auto v = o.values();
  sent_[d.key()].assign(v.begin(), v.end());
}

void gradient_hook_filter::gradient(const micro_batch_key& k, crossing& g) {
  const auto sent = take_kept(sent_, k);
  if (!sent || g.rows() <= 0) return;
  const auto in = g.values();
  std::vector<float> v(in.begin(), in.end());
  hook_(v, *sent, g.rows());
  CLEAVE_ASSERT(v.size() == in.size());
  std::copy(v.begin(), v.end(), g.edit().begin());
}

void gradient_hook_filter::discard(std::uint32_t device) {
  forget(sent_, device);
}

void label_equalise_filter::loss_gradient(const micro_batch_key& k, crossing& g) {
  const std::int64_t n = g.rows(), d = g.width();
  const std::span<float> v = g.edit();
  const std::vector<double> norm2 = row_norms2(v, n, d);
  double sum2 = 0;
  for (const double x : norm2) sum2 += x;
  const double rms = std::sqrt(sum2 / static_cast<double>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const double nm = std::sqrt(norm2[static_cast<std::size_t>(i)]);
    if (!(nm > 0) || !std::isfinite(rms)) continue;
    const float f = static_cast<float>(rms / nm);
    for (std::int64_t j = 0; j < d; ++j) v[static_cast<std::size_t>(i * d + j)] *= f;
  }
  (void)k;
}

void label_noise_filter::loss_gradient(const micro_batch_key& k, crossing& g) {
  const std::int64_t n = g.rows(), d = g.width();
  const std::span<float> v = g.edit();
  const std::vector<double> norm2 = row_norms2(v, n, d);
  const double most = *std::max_element(norm2.begin(), norm2.end());
  const double s2 = s_ * s_;
  core::rng r(core::micro_batch_seed(seed_, k.device, k.step, k.micro_batch, core::stream::label_noise));
  for (std::int64_t i = 0; i < n; ++i) {
    const double gap = std::max(0.0, most - norm2[static_cast<std::size_t>(i)]);
    const double sd = std::sqrt(s2 * gap / static_cast<double>(d));
    for (std::int64_t j = 0; j < d; ++j) v[static_cast<std::size_t>(i * d + j)] += static_cast<float>(sd * r.normal());
  }
}

filter_chain device_filters(const device_defences& d) {
  filter_chain c;
  if (d.nopeek > 0) c.add(std::make_unique<nopeek_filter>(d.nopeek));
  if (d.activation_clip > 0) c.add(std::make_unique<clip_filter>(d.activation_clip, d.activation_noise, d.seed));
  if (d.check_window > 0) c.add(std::make_unique<gradient_check_filter>(d.check_window, d.check_threshold));
  if (d.hook) c.add(std::make_unique<gradient_hook_filter>(d.hook));
  if (d.equalise) c.add(std::make_unique<label_equalise_filter>());
  if (d.gradient_noise >= 0) c.add(std::make_unique<label_noise_filter>(d.gradient_noise, d.seed));
  return c;
}

}  // namespace cleave::privacy
