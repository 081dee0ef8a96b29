// The chain of cut filters and the host views of what crosses: one download when a filter reads,
// one upload when one changed it.
#include "cleave/privacy/cut_filter.h"

#include "cleave/core/error.h"

namespace cleave::privacy {

crossing::crossing(core::backend& b, const core::tensor& t) : b_(&b), t_(t) {
  n_ = t.shape().rank() ? t.shape()[0] : 0;
  d_ = n_ > 0 ? t.numel() / n_ : 0;
}

std::span<const float> crossing::values() {
  if (!loaded_) {
    v_.resize(static_cast<std::size_t>(t_.numel()));
    if (!v_.empty()) b_->download(t_, v_.data());
    loaded_ = true;
  }
  return v_;
}

std::span<float> crossing::edit() {
  values();
  changed_ = true;
  return v_;
}

core::tensor crossing::result() const {
  if (!changed_) return t_;
  core::tensor out = b_->empty(t_.shape());
  b_->upload(out, v_.data());
  return out;
}

departure::departure(core::backend& b, micro_batch_key key, const core::tensor& x, const core::tensor& y,
                     std::span<const std::int32_t> host_y, std::uint32_t batch_size, int label_groups)
    : b_(&b), key_(key), x_(&x), y_(&y), host_y_(host_y), batch_size_(batch_size), label_groups_(label_groups) {}

std::span<const float> departure::inputs() {
  if (xv_.empty() && x_->numel() > 0) {
    xv_.resize(static_cast<std::size_t>(x_->numel()));
    b_->download(*x_, xv_.data());
  }
  return xv_;
}

std::int64_t departure::input_width() const {
  const std::int64_t n = x_->shape().rank() ? x_->shape()[0] : 0;
  return n > 0 ? x_->numel() / n : 0;
}

std::span<const std::int32_t> departure::labels() {
  const auto n = static_cast<std::size_t>(y_->numel());
  if (host_y_.size() == n) return host_y_;
  if (yv_.size() != n) {
    yv_.resize(n);
    if (n > 0) b_->download(*y_, yv_.data());
  }
  return yv_;
}

filter_chain& filter_chain::add(std::unique_ptr<cut_filter> f) {
  CLEAVE_ASSERT(f != nullptr);
  filters_.push_back(std::move(f));
  return *this;
}

core::tensor filter_chain::output(core::backend& b, departure& d, const core::tensor& o) {
  crossing c(b, o);
  if (filters_.empty() || c.rows() <= 0) return o;
  for (const auto& f : filters_) f->output(d, c);
  return c.result();
}

core::tensor filter_chain::gradient(core::backend& b, const micro_batch_key& k, const core::tensor& dy) {
  // Also a gradient of no rows: the filters forget what they kept for k.
  crossing c(b, dy);
  if (filters_.empty()) return dy;
  for (auto it = filters_.rbegin(); it != filters_.rend(); ++it) (*it)->gradient(k, c);
  return c.result();
}

core::tensor filter_chain::loss_gradient(core::backend& b, const micro_batch_key& k, const core::tensor& g) {
  crossing c(b, g);
  if (filters_.empty() || c.rows() <= 0) return g;
  for (const auto& f : filters_) f->loss_gradient(k, c);
  return c.result();
}

void filter_chain::discard(std::uint32_t device) {
  for (const auto& f : filters_) f->discard(device);
}

}  // namespace cleave::privacy
