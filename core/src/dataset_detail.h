// What the IDX and CIFAR readers share: pixel scaling, the training split's per-channel
// statistics, the choice of kept training samples and the streamed read of the training split.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cleave/core/dataset.h"
#include "cleave/core/error.h"

namespace cleave::core::detail {

inline float scaled(std::uint8_t p) {
  return static_cast<float>(p) * (1.0f / 255.0f);
}

// The training split's pixel values counted per channel; the mean and variance of the scaled
// values follow from the counts exactly (a count per value instead of a sum per pixel: a few
// times faster, and no rounding in the accumulation).
struct channel_stats {
  std::vector<std::uint64_t> count;  // count[ch * 256 + p]
  std::size_t channels;
  std::uint64_t n_per_channel = 0;

  explicit channel_stats(std::size_t c) : count(c * 256), channels(c) {}
  // samples (n,C,H*W)
  void add(const std::uint8_t* samples, std::uint64_t n, std::uint64_t hw) {
    for (std::uint64_t s = 0; s < n; ++s)
      for (std::size_t ch = 0; ch < channels; ++ch) {
        const std::uint8_t* p = samples + (s * channels + ch) * hw;
        std::uint64_t* h = count.data() + ch * 256;
        for (std::uint64_t j = 0; j < hw; ++j) ++h[p[j]];
      }
    n_per_channel += n * hw;
  }
  std::size_t size() const { return channels; }
  // table[c * 256 + p] = (p / 255 - mean_c) / stdev_c
  std::vector<float> table() const {
    std::vector<float> t(channels * 256);
    const auto total = static_cast<double>(n_per_channel);
    for (std::size_t ch = 0; ch < channels; ++ch) {
      double sum = 0, sq = 0;
      for (int p = 0; p < 256; ++p) {
        const double v = scaled(static_cast<std::uint8_t>(p)), k = static_cast<double>(count[ch * 256 + p]);
        sum += k * v;
        sq += k * v * v;
      }
      const double mean = sum / total;
      const double stdev = std::sqrt(std::max(1e-12, sq / total - mean * mean));
      for (int p = 0; p < 256; ++p)
        t[ch * 256 + static_cast<std::size_t>(p)] =
            static_cast<float>((static_cast<double>(scaled(static_cast<std::uint8_t>(p))) - mean) / stdev);
    }
    return t;
  }
};

// The training samples `o` keeps: pick_train's choice, or all of them in order.
inline std::vector<std::int64_t> kept_samples(const load_options& o, const std::vector<std::int32_t>& labels,
                                              int n_classes) {
  if (o.pick_train) return o.pick_train(labels, n_classes);
  std::vector<std::int64_t> keep(labels.size());
  for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = static_cast<std::int64_t>(i);
  return keep;
}

// Streams a training split from `source` (size(), per_sample(), read_nchw(count, dst),
// expect_end()): statistics of all its samples, pixels of the samples `keep` (in that order) only.
// `where` names the source in errors, e.g. "data file 'x'".
template <class Source>
std::vector<std::uint8_t> stream_train(Source& source, const std::vector<std::int64_t>& keep, channel_stats& stats,
                                       const std::string& where) {
  const std::uint64_t per = source.per_sample(), n = source.size();
  // (source sample, position in the kept set), by source.
  std::vector<std::pair<std::int64_t, std::int64_t>> wanted(keep.size());
  for (std::size_t i = 0; i < keep.size(); ++i) {
    if (keep[i] < 0 || static_cast<std::uint64_t>(keep[i]) >= n)
      throw error(where + ": sample " + std::to_string(keep[i]) + " asked for, it has " + std::to_string(n));
    wanted[i] = {keep[i], static_cast<std::int64_t>(i)};
  }
  std::sort(wanted.begin(), wanted.end());
  std::vector<std::uint8_t> out(keep.size() * per);
  constexpr std::uint64_t chunk = 512;
  std::vector<std::uint8_t> buf(chunk * per);
  auto next = wanted.begin();
  for (std::uint64_t first = 0; first < n; first += chunk) {
    const std::uint64_t count = std::min(chunk, n - first);
    source.read_nchw(count, buf.data());
    stats.add(buf.data(), count, per / stats.size());
    for (; next != wanted.end() && static_cast<std::uint64_t>(next->first) < first + count; ++next)
      std::memcpy(out.data() + static_cast<std::uint64_t>(next->second) * per,
                  buf.data() + (static_cast<std::uint64_t>(next->first) - first) * per, per);
  }
  source.expect_end();
  return out;
}

enum class cifar_kind { cifar10, cifar100 };

// A CIFAR-10 or CIFAR-100 binary directory `dir` read as load_dataset documents; `name` names the
// data set.
dataset_split load_cifar(const std::string& name, const std::string& dir, cifar_kind kind, const load_options& o);

}  // namespace cleave::core::detail
