// The data_source defaults, the checks of what a source says of itself, and subset views.
#include "cleave/core/data_source.h"

#include "cleave/core/dataset.h"
#include "cleave/core/error.h"

namespace cleave::core {

void data_source::fetch_augmented(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out,
                                  const augment_config& a, std::uint64_t seed, std::int64_t epoch) const {
  if (a.any())
    throw error("data source '" + describe() + "' cannot augment its samples (asked for " + augment_str(a) + ")");
  fetch(idx, n, x_out, y_out);
}

void check_source(const data_source& s) {
  const std::string who = "data source '" + s.describe() + "': ";
  const shape item = s.sample_shape();
  if (item.rank() != 3 || item.numel() <= 0)
    throw error(who + "a sample must have a positive (C,H,W) shape, got " + item.str());
  if (s.class_count() < 1) throw error(who + "needs at least 1 class, got " + std::to_string(s.class_count()));
  const auto labels = s.labels();
  if (static_cast<std::int64_t>(labels.size()) != s.size())
    throw error(who + std::to_string(s.size()) + " samples but " + std::to_string(labels.size()) + " labels");
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] < 0 || labels[i] >= s.class_count())
      throw error(who + "label " + std::to_string(labels[i]) + " of sample " + std::to_string(i) + " is not in [0, " +
                  std::to_string(s.class_count()) + ")");
}

namespace {

class subset_view final : public data_source {
 public:
  subset_view(std::shared_ptr<const data_source> s, std::vector<std::int64_t> idx)
      : s_(std::move(s)), idx_(std::move(idx)) {}

  std::int64_t size() const override { return static_cast<std::int64_t>(idx_.size()); }
  shape sample_shape() const override { return s_->sample_shape(); }
  int class_count() const override { return s_->class_count(); }
  std::vector<std::int32_t> labels() const override {
    const auto all = s_->labels();
    std::vector<std::int32_t> out(idx_.size());
    for (std::size_t i = 0; i < idx_.size(); ++i) out[i] = all[static_cast<std::size_t>(idx_[i])];
    return out;
  }
  void fetch(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out) const override {
    const auto mapped = map(idx, n);
    s_->fetch(mapped.data(), n, x_out, y_out);
  }
  void fetch_augmented(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out,
                       const augment_config& a, std::uint64_t seed, std::int64_t epoch) const override {
    const auto mapped = map(idx, n);
    s_->fetch_augmented(mapped.data(), n, x_out, y_out, a, seed, epoch);
  }
  std::string describe() const override { return s_->describe(); }

 private:
  std::vector<std::int64_t> map(const std::int64_t* idx, std::int64_t n) const {
    std::vector<std::int64_t> out(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = idx_[static_cast<std::size_t>(idx[i])];
    return out;
  }

  std::shared_ptr<const data_source> s_;
  std::vector<std::int64_t> idx_;
};

}  // namespace

std::shared_ptr<const data_source> subset_of(std::shared_ptr<const data_source> s, std::vector<std::int64_t> idx) {
  CLEAVE_ASSERT(s != nullptr, "subset_of a source");
  const std::int64_t n = s->size();
  for (const std::int64_t i : idx)
    if (i < 0 || i >= n)
      throw error("data source '" + s->describe() + "': sample " + std::to_string(i) + " asked for, it has " +
                  std::to_string(n));
  if (const auto* d = dynamic_cast<const dataset*>(s.get())) return std::make_shared<dataset>(d->subset(idx));
  return std::make_shared<subset_view>(std::move(s), std::move(idx));
}

}  // namespace cleave::core
