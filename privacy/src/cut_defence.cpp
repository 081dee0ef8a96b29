#include "cleave/privacy/cut_defence.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "cleave/core/error.h"

namespace cleave::privacy {

namespace {

std::int64_t row_length(std::size_t size, std::int64_t n, const char* what) {
  if (n <= 0 || size % static_cast<std::size_t>(n) != 0)
    throw core::error(std::string(what) + ": " + std::to_string(size) + " values are not " + std::to_string(n) +
                      " rows");
  return static_cast<std::int64_t>(size) / n;
}

// Pairwise Euclidean distances of the rows of v (n x d), n x n.
std::vector<double> distances(std::span<const float> v, std::int64_t d, std::int64_t n) {
  std::vector<double> out(static_cast<std::size_t>(n * n), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = i + 1; j < n; ++j) {
      const float* a = v.data() + i * d;
      const float* b = v.data() + j * d;
      double s = 0;
      for (std::int64_t k = 0; k < d; ++k) {
        const double t = static_cast<double>(a[k]) - b[k];
        s += t * t;
      }
      out[static_cast<std::size_t>(i * n + j)] = out[static_cast<std::size_t>(j * n + i)] = std::sqrt(s);
    }
  return out;
}

// Double centering in place: a_ij - mean of row i - mean of column j + mean of all.
void double_center(std::vector<double>& a, std::int64_t n) {
  std::vector<double> row(static_cast<std::size_t>(n), 0.0);
  double all = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < n; ++j) row[static_cast<std::size_t>(i)] += a[static_cast<std::size_t>(i * n + j)];
    all += row[static_cast<std::size_t>(i)];
    row[static_cast<std::size_t>(i)] /= static_cast<double>(n);
  }
  all /= static_cast<double>(n * n);
  // Symmetric: column means are row means.
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      a[static_cast<std::size_t>(i * n + j)] +=
          all - row[static_cast<std::size_t>(i)] - row[static_cast<std::size_t>(j)];
}

}  // namespace

std::vector<float> clip_rows(std::span<float> v, std::int64_t n, double clip) {
  if (!(clip > 0)) throw core::error("clipping bound " + std::to_string(clip) + ": must be > 0");
  const std::int64_t d = row_length(v.size(), n, "clip_rows");
  std::vector<float> scale(static_cast<std::size_t>(n), 1.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    float* r = v.data() + i * d;
    double s2 = 0;
    for (std::int64_t k = 0; k < d; ++k) s2 += static_cast<double>(r[k]) * r[k];
    const double norm = std::sqrt(s2);
    if (norm <= clip) continue;
    const float s = static_cast<float>(clip / norm);
    scale[static_cast<std::size_t>(i)] = s;
    for (std::int64_t k = 0; k < d; ++k) r[k] *= s;
  }
  return scale;
}

void clip_rows_backward(std::span<float> g, std::span<const float> clipped, std::span<const float> scale,
                        std::int64_t n, double clip) {
  const std::int64_t d = row_length(g.size(), n, "clip_rows_backward");
  if (clipped.size() != g.size() || scale.size() != static_cast<std::size_t>(n))
    throw core::error("clip_rows_backward: the clipped rows or scales do not match the gradient");
  for (std::int64_t i = 0; i < n; ++i) {
    const float s = scale[static_cast<std::size_t>(i)];
    if (s >= 1.0f) continue;  // within the bound: the identity
    // y = C x / |x|: dx = (C / |x|) (dy - u (u . dy)), u = x / |x| = y / C.
    float* gr = g.data() + i * d;
    const float* y = clipped.data() + i * d;
    double dot = 0;
    for (std::int64_t k = 0; k < d; ++k) dot += static_cast<double>(y[k]) * gr[k];
    const double c2 = clip * clip;
    for (std::int64_t k = 0; k < d; ++k) gr[k] = static_cast<float>(s * (gr[k] - y[k] * dot / c2));
  }
}

double distance_correlation(std::span<const float> x, std::int64_t dx, std::span<const float> z, std::int64_t dz,
                            std::int64_t n, std::span<float> grad_z) {
  if (n < 2 || x.size() != static_cast<std::size_t>(n * dx) || z.size() != static_cast<std::size_t>(n * dz))
    throw core::error("distance_correlation: " + std::to_string(n) + " rows of " + std::to_string(dx) + " and " +
                      std::to_string(dz) + " values do not match " + std::to_string(x.size()) + " and " +
                      std::to_string(z.size()));
  if (!grad_z.empty() && grad_z.size() != z.size())
    throw core::error("distance_correlation: the gradient does not match z");
  std::vector<double> a = distances(x, dx, n);
  const std::vector<double> b_dist = distances(z, dz, n);
  std::vector<double> b = b_dist;
  double_center(a, n);
  double_center(b, n);
  double p = 0, qx = 0, qz = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    p += a[k] * b[k];
    qx += a[k] * a[k];
    qz += b[k] * b[k];
  }
  if (!grad_z.empty()) std::fill(grad_z.begin(), grad_z.end(), 0.0f);
  const double den = std::sqrt(qx * qz);
  if (!(den > 0)) return 0.0;
  const double r2 = std::max(0.0, p / den);
  const double r = std::sqrt(r2);
  if (grad_z.empty() || !(r > 0)) return r;
  // d r2 / d b_ij = (A_ij - (p / qz) B_ij) / den: the centering is a projection that leaves the
  // centered A in place. d r = d r2 / (2 r); b_ij = |z_i - z_j| appears at (i, j) and (j, i).
  for (std::int64_t i = 0; i < n; ++i) {
    float* gi = grad_z.data() + i * dz;
    const float* zi = z.data() + i * dz;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::size_t ij = static_cast<std::size_t>(i * n + j);
      const double dist = b_dist[ij];
      if (i == j || !(dist > 0)) continue;
      const double gb = (a[ij] - p / qz * b[ij]) / den / (2.0 * r);
      const double f = 2.0 * gb / dist;
      const float* zj = z.data() + j * dz;
      for (std::int64_t k = 0; k < dz; ++k) gi[k] += static_cast<float>(f * (static_cast<double>(zi[k]) - zj[k]));
    }
  }
  return r;
}

double label_alignment(std::span<const float> g, std::int64_t n, std::span<const std::int32_t> labels) {
  const std::int64_t d = row_length(g.size(), n, "label_alignment");
  if (labels.size() != static_cast<std::size_t>(n)) throw core::error("label_alignment: labels do not match rows");
  std::vector<double> norm(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (std::int64_t k = 0; k < d; ++k) s += static_cast<double>(g[i * d + k]) * g[i * d + k];
    norm[static_cast<std::size_t>(i)] = std::sqrt(s);
  }
  double same = 0, diff = 0;
  std::int64_t n_same = 0, n_diff = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (!(norm[static_cast<std::size_t>(i)] > 0)) continue;
    for (std::int64_t j = i + 1; j < n; ++j) {
      if (!(norm[static_cast<std::size_t>(j)] > 0)) continue;
      double dot = 0;
      for (std::int64_t k = 0; k < d; ++k) dot += static_cast<double>(g[i * d + k]) * g[j * d + k];
      const double c = dot / (norm[static_cast<std::size_t>(i)] * norm[static_cast<std::size_t>(j)]);
      if (labels[static_cast<std::size_t>(i)] == labels[static_cast<std::size_t>(j)])
        same += c, ++n_same;
      else
        diff += c, ++n_diff;
    }
  }
  if (n_same == 0 || n_diff == 0) return std::numeric_limits<double>::quiet_NaN();
  return same / static_cast<double>(n_same) - diff / static_cast<double>(n_diff);
}

std::span<const double> rdp_accountant::orders() {
  static constexpr std::array<double, 27> o{1.1, 1.25, 1.5, 1.75, 2,  2.5, 3,  3.5, 4,  5,   6,   7,   8,   10,
                                            12,  14,   16,  20,   24, 28,  32, 48,  64, 128, 256, 512, 1024};
  return o;
}

void rdp_accountant::add_gaussian(double noise_multiplier, std::uint64_t count) {
  releases_ += count;
  const auto o = orders();
  for (std::size_t k = 0; k < o.size(); ++k)
    rdp_[k] += noise_multiplier > 0 ? static_cast<double>(count) * o[k] / (2.0 * noise_multiplier * noise_multiplier)
               : count > 0          ? std::numeric_limits<double>::infinity()
                                    : 0.0;
}

double rdp_accountant::epsilon(double delta) const {
  if (!(delta > 0 && delta < 1)) throw core::error("delta " + std::to_string(delta) + ": must be in (0, 1)");
  if (releases_ == 0) return 0.0;
  const auto o = orders();
  double best = std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k < o.size(); ++k) {
    const double a = o[k];
    // Balle et al. 2020, Theorem 21: eps = rdp + log((a - 1) / a) - (log delta + log a) / (a - 1).
    const double e = rdp_[k] + std::log((a - 1) / a) - (std::log(delta) + std::log(a)) / (a - 1);
    best = std::min(best, e);
  }
  return std::max(0.0, best);
}

void gradient_monitor::add(double alignment) {
  if (std::isnan(alignment)) return;
  if (static_cast<int>(last_.size()) < window_) {
    last_.push_back(alignment);
    return;
  }
  last_[next_] = alignment;
  next_ = (next_ + 1) % last_.size();
}

double gradient_monitor::mean() const {
  if (last_.empty()) return std::numeric_limits<double>::quiet_NaN();
  double s = 0;
  for (double v : last_) s += v;
  return s / static_cast<double>(last_.size());
}

}  // namespace cleave::privacy
