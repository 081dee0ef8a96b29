// Weighted block averages.
#include "cleave/split/aggregate.h"

#include <algorithm>

#include "cleave/core/error.h"

namespace cleave::split {

model_average::model_average(const core::model_spec& m)
    : layout_(core::layout_of(m)),
      weight_(static_cast<std::size_t>(m.n_blocks()), 0.0),
      params_(static_cast<std::size_t>(layout_.param_offset.back()), 0.0),
      buffers_(static_cast<std::size_t>(layout_.buffer_offset.back()), 0.0) {}

void model_average::check_fits(int first, int end, double weight, std::size_t n_params, std::size_t n_buffers) const {
  const int n = static_cast<int>(weight_.size());
  if (first < 0 || first > end || end > n)
    throw core::error("replica blocks [" + std::to_string(first) + "," + std::to_string(end) + ") outside the model");
  const auto p0 = layout_.param_offset[static_cast<std::size_t>(first)];
  const auto p1 = layout_.param_offset[static_cast<std::size_t>(end)];
  const auto b0 = layout_.buffer_offset[static_cast<std::size_t>(first)];
  const auto b1 = layout_.buffer_offset[static_cast<std::size_t>(end)];
  if (static_cast<std::int64_t>(n_params) != p1 - p0 || static_cast<std::int64_t>(n_buffers) != b1 - b0)
    throw core::error("replica of blocks [" + std::to_string(first) + "," + std::to_string(end) + ") has " +
                      std::to_string(n_params) + " parameters and " + std::to_string(n_buffers) +
                      " state values, expected " + std::to_string(p1 - p0) + " and " + std::to_string(b1 - b0));
  if (!(weight > 0.0)) throw core::error("replica weight must be > 0");
}

void model_average::add(int first, int end, double weight, std::span<const float> params,
                        std::span<const float> buffers) {
  check_fits(first, end, weight, params.size(), buffers.size());
  const auto p0 = layout_.param_offset[static_cast<std::size_t>(first)];
  const auto p1 = layout_.param_offset[static_cast<std::size_t>(end)];
  const auto b0 = layout_.buffer_offset[static_cast<std::size_t>(first)];
  const auto b1 = layout_.buffer_offset[static_cast<std::size_t>(end)];
  for (int b = first; b < end; ++b) weight_[static_cast<std::size_t>(b)] += weight;
  for (std::int64_t i = 0; i < p1 - p0; ++i)
    params_[static_cast<std::size_t>(p0 + i)] += weight * params[static_cast<std::size_t>(i)];
  for (std::int64_t i = 0; i < b1 - b0; ++i)
    buffers_[static_cast<std::size_t>(b0 + i)] += weight * buffers[static_cast<std::size_t>(i)];
}

void model_average::clear() {
  std::fill(weight_.begin(), weight_.end(), 0.0);
  std::fill(params_.begin(), params_.end(), 0.0);
  std::fill(buffers_.begin(), buffers_.end(), 0.0);
}

bool model_average::covers_all() const {
  return std::all_of(weight_.begin(), weight_.end(), [](double w) { return w > 0.0; });
}

std::vector<model_average::run> model_average::runs() const {
  std::vector<run> out;
  const int n = static_cast<int>(weight_.size());
  for (int b = 0; b < n;) {
    const double w = weight_[static_cast<std::size_t>(b)];
    int e = b + 1;
    while (e < n && weight_[static_cast<std::size_t>(e)] == w) ++e;
    if (w > 0.0) out.push_back({b, e, w});
    b = e;
  }
  return out;
}

void model_average::mean(int first, int end, std::vector<float>& params, std::vector<float>& buffers) const {
  params.clear();
  buffers.clear();
  for (int b = first; b < end; ++b) {
    const double w = weight_[static_cast<std::size_t>(b)];
    CLEAVE_ASSERT(w > 0.0, "mean of a block without replicas");
    for (auto i = layout_.param_offset[static_cast<std::size_t>(b)];
         i < layout_.param_offset[static_cast<std::size_t>(b) + 1]; ++i)
      params.push_back(static_cast<float>(params_[static_cast<std::size_t>(i)] / w));
    for (auto i = layout_.buffer_offset[static_cast<std::size_t>(b)];
         i < layout_.buffer_offset[static_cast<std::size_t>(b) + 1]; ++i)
      buffers.push_back(static_cast<float>(buffers_[static_cast<std::size_t>(i)] / w));
  }
}

void model_average::mean_into(std::vector<float>& params, std::vector<float>& buffers) const {
  CLEAVE_ASSERT(static_cast<std::int64_t>(params.size()) == layout_.param_offset.back() &&
                static_cast<std::int64_t>(buffers.size()) == layout_.buffer_offset.back());
  for (std::size_t b = 0; b < weight_.size(); ++b) {
    const double w = weight_[b];
    if (!(w > 0.0)) continue;
    for (auto i = layout_.param_offset[b]; i < layout_.param_offset[b + 1]; ++i)
      params[static_cast<std::size_t>(i)] = static_cast<float>(params_[static_cast<std::size_t>(i)] / w);
    for (auto i = layout_.buffer_offset[b]; i < layout_.buffer_offset[b + 1]; ++i)
      buffers[static_cast<std::size_t>(i)] = static_cast<float>(buffers_[static_cast<std::size_t>(i)] / w);
  }
}

}  // namespace cleave::split
