// Aggregation rules: the weighted mean, coordinate-wise median and trimmed mean, clipped updates.
#include "cleave/split/aggregator.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "cleave/core/error.h"

namespace cleave::split {

namespace {

// A number after "name:" in an aggregation rule; throws naming the rule when it is not one.
double number_after(const std::string& text, std::size_t colon) {
  const std::string s = text.substr(colon + 1);
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (...) {
    used = 0;
  }
  if (s.empty() || used != s.size()) throw core::error("'" + s + "' in '" + text + "' is not a number");
  return v;
}

// The shortest text that reads back as v.
std::string short_number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// Orders values with NaN last, so that sorting stays well defined for any input.
bool nan_last(float a, float b) {
  return std::isnan(b) ? !std::isnan(a) : a < b;
}

}  // namespace

aggregate_rule parse_aggregate(const std::string& text) {
  aggregate_rule r;
  const auto colon = text.find(':');
  const std::string name = text.substr(0, colon);
  if (name == "mean" && colon == std::string::npos) {
    r.kind = aggregate_kind::mean;
  } else if (name == "median" && colon == std::string::npos) {
    r.kind = aggregate_kind::median;
  } else if (name == "trimmed-mean" && colon != std::string::npos) {
    r.kind = aggregate_kind::trimmed_mean;
    r.fraction = number_after(text, colon);
  } else if (name == "clip" && colon != std::string::npos) {
    r.kind = aggregate_kind::clip;
    r.clip_norm = number_after(text, colon);
  } else {
    throw core::error("unknown aggregation '" + text + "' (known: mean, median, trimmed-mean:F, clip:C)");
  }
  check_rule(r);
  return r;
}

void check_rule(const aggregate_rule& r) {
  if (r.kind == aggregate_kind::trimmed_mean && !(r.fraction >= 0.0 && r.fraction < 0.5))
    throw core::error("trimmed-mean:F needs 0 <= F < 0.5, not " + short_number(r.fraction));
  if (r.kind == aggregate_kind::clip && !(r.clip_norm > 0.0 && std::isfinite(r.clip_norm)))
    throw core::error("clip:C needs a finite C > 0, not " + short_number(r.clip_norm));
}

std::string aggregate_name(const aggregate_rule& r) {
  switch (r.kind) {
    case aggregate_kind::mean:
      return "mean";
    case aggregate_kind::median:
      return "median";
    case aggregate_kind::trimmed_mean:
      return "trimmed-mean:" + short_number(r.fraction);
    case aggregate_kind::clip:
      return "clip:" + short_number(r.clip_norm);
  }
  return "mean";
}

aggregator::aggregator(const core::model_spec& m, const aggregate_rule& rule, std::span<const float> start_params,
                       std::span<const float> start_buffers)
    : rule_(rule), sums_(m), count_(static_cast<std::size_t>(m.n_blocks()), 0) {
  check_rule(rule_);
  if (rule_.kind == aggregate_kind::clip) {
    CLEAVE_ASSERT(static_cast<std::int64_t>(start_params.size()) == sums_.layout().param_offset.back() &&
                      static_cast<std::int64_t>(start_buffers.size()) == sums_.layout().buffer_offset.back(),
                  "clip needs the whole starting model");
    start_p_.assign(start_params.begin(), start_params.end());
    start_b_.assign(start_buffers.begin(), start_buffers.end());
  }
}

void aggregator::add(int first, int end, double weight, std::span<const float> params, std::span<const float> buffers) {
  sums_.check_fits(first, end, weight, params.size(), buffers.size());
  for (int blk = first; blk < end; ++blk) ++count_[static_cast<std::size_t>(blk)];
  if (rule_.kind != aggregate_kind::clip) {
    sums_.add(first, end, weight, params, buffers);
    if (rule_.kind != aggregate_kind::mean)
      kept_.push_back({first, end, {params.begin(), params.end()}, {buffers.begin(), buffers.end()}});
    return;
  }
  // The update against the round's start, over the whole replica (parameters and state alike:
  // both are averaged into the global model).
  const auto p0 = static_cast<std::size_t>(sums_.layout().param_offset[static_cast<std::size_t>(first)]);
  const auto b0 = static_cast<std::size_t>(sums_.layout().buffer_offset[static_cast<std::size_t>(first)]);
  double sq = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const double u = static_cast<double>(params[i]) - start_p_[p0 + i];
    sq += u * u;
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const double u = static_cast<double>(buffers[i]) - start_b_[b0 + i];
    sq += u * u;
  }
  const double norm = std::sqrt(sq);
  if (!(norm > rule_.clip_norm)) return sums_.add(first, end, weight, params, buffers);
  const double scale = rule_.clip_norm / norm;
  auto clipped = [scale](std::span<const float> v, const std::vector<float>& start, std::size_t at) {
    std::vector<float> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double s = start[at + i];
      out[i] = static_cast<float>(s + scale * (static_cast<double>(v[i]) - s));
    }
    return out;
  };
  sums_.add(first, end, weight, clipped(params, start_p_, p0), clipped(buffers, start_b_, b0));
}

float aggregator::robust_value(std::vector<float>& v) const {
  const std::size_t n = v.size();
  if (rule_.kind == aggregate_kind::median) {
    const auto mid = v.begin() + static_cast<std::ptrdiff_t>(n / 2);
    std::nth_element(v.begin(), mid, v.end(), nan_last);
    if (n % 2 == 1) return *mid;
    const float below = *std::max_element(v.begin(), mid, nan_last);
    return static_cast<float>((static_cast<double>(below) + static_cast<double>(*mid)) / 2.0);
  }
  std::sort(v.begin(), v.end(), nan_last);
  const auto k = static_cast<std::size_t>(std::floor(rule_.fraction * static_cast<double>(n)));
  double sum = 0;
  for (std::size_t i = k; i < n - k; ++i) sum += v[i];
  return static_cast<float>(sum / static_cast<double>(n - 2 * k));
}

void aggregator::result_into(std::vector<float>& params, std::vector<float>& buffers) const {
  if (!rule_.per_device() || rule_.kind == aggregate_kind::clip) return sums_.mean_into(params, buffers);
  const auto& lay = sums_.layout();
  CLEAVE_ASSERT(static_cast<std::int64_t>(params.size()) == lay.param_offset.back() &&
                static_cast<std::int64_t>(buffers.size()) == lay.buffer_offset.back());
  std::vector<const replica*> holders;
  std::vector<float> values;
  for (std::size_t blk = 0; blk < count_.size(); ++blk) {
    if (count_[blk] == 0) continue;
    holders.clear();
    for (const auto& r : kept_)
      if (r.first <= static_cast<int>(blk) && static_cast<int>(blk) < r.end) holders.push_back(&r);
    for (auto i = lay.param_offset[blk]; i < lay.param_offset[blk + 1]; ++i) {
      values.clear();
      for (const auto* r : holders)
        values.push_back(r->params[static_cast<std::size_t>(i - lay.param_offset[static_cast<std::size_t>(r->first)])]);
      params[static_cast<std::size_t>(i)] = robust_value(values);
    }
    for (auto i = lay.buffer_offset[blk]; i < lay.buffer_offset[blk + 1]; ++i) {
      values.clear();
      for (const auto* r : holders)
        values.push_back(
            r->buffers[static_cast<std::size_t>(i - lay.buffer_offset[static_cast<std::size_t>(r->first)])]);
      buffers[static_cast<std::size_t>(i)] = robust_value(values);
    }
  }
}

}  // namespace cleave::split
