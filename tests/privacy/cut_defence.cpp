// The cut's defences: clipping and its exact gradient, distance correlation (NoPeek) and its
// gradient against finite differences and an independent formula, the label alignment of
// gradients, and the Renyi DP accountant against the exact privacy of the Gaussian mechanism.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "../support/error_of.h"
#include "cleave/privacy/cut_defence.h"

using namespace cleave;
using namespace cleave::privacy;
using cleave::testing::error_of;

namespace {

std::vector<float> gaussian(std::size_t n, std::uint32_t seed, float sd = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double row_norm(const std::vector<float>& v, std::int64_t i, std::int64_t d) {
  double s = 0;
  for (std::int64_t k = 0; k < d; ++k) s += double(v[i * d + k]) * v[i * d + k];
  return std::sqrt(s);
}

// Szekely's V-statistics from their own formula: dCov^2 = S1 + S2 - 2 S3.
double dcov2(const std::vector<double>& a, const std::vector<double>& b, std::int64_t n) {
  double s1 = 0, ma = 0, mb = 0, s3 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double ra = 0, rb = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      s1 += a[i * n + j] * b[i * n + j];
      ra += a[i * n + j];
      rb += b[i * n + j];
    }
    ma += ra;
    mb += rb;
    s3 += (ra / n) * (rb / n);
  }
  const double nn = double(n) * n;
  return s1 / nn + (ma / nn) * (mb / nn) - 2 * s3 / n;
}

std::vector<double> dist(const std::vector<float>& v, std::int64_t d, std::int64_t n) {
  std::vector<double> out(static_cast<std::size_t>(n * n));
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      out[i * n + j] = row_norm(
          [&] {
            std::vector<float> t(d);
            for (std::int64_t k = 0; k < d; ++k) t[k] = v[i * d + k] - v[j * d + k];
            return t;
          }(),
          0, d);
  return out;
}

double dcor_by_definition(const std::vector<float>& x, std::int64_t dx, const std::vector<float>& z, std::int64_t dz,
                          std::int64_t n) {
  const auto a = dist(x, dx, n), b = dist(z, dz, n);
  return std::sqrt(dcov2(a, b, n) / std::sqrt(dcov2(a, a, n) * dcov2(b, b, n)));
}

// The exact delta at epsilon of the Gaussian mechanism with mu = sensitivity / std
// (Balle and Wang, 2018).
double exact_delta(double mu, double eps) {
  const auto phi = [](double t) { return 0.5 * std::erfc(-t / std::sqrt(2.0)); };
  return phi(-eps / mu + mu / 2) - std::exp(eps) * phi(-eps / mu - mu / 2);
}

double exact_epsilon(double mu, double delta) {
  double lo = 0, hi = 500;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (exact_delta(mu, mid) > delta ? lo : hi) = mid;
  }
  return hi;
}

}  // namespace

TEST_CASE("clipping bounds every row's norm, leaves short rows alone, and its gradient is exact") {
  const std::int64_t n = 6, d = 5;
  auto v = gaussian(n * d, 1, 1.0f);
  for (std::int64_t k = 0; k < d; ++k) v[2 * d + k] *= 0.05f;  // row 2 well inside the bound
  const auto before = v;
  const double c = 1.0;
  const auto scale = clip_rows(v, n, c);
  for (std::int64_t i = 0; i < n; ++i) {
    CHECK(row_norm(v, i, d) <= c * (1 + 1e-6));
    if (row_norm(before, i, d) > c)
      CHECK(row_norm(v, i, d) == doctest::Approx(c).epsilon(1e-6));
    else
      CHECK(scale[i] == 1.0f);
  }
  CHECK(v[2 * d] == before[2 * d]);

  // L = sum w . clip(x): the backward against central differences of L.
  const auto w = gaussian(n * d, 2);
  std::vector<float> g = w;
  clip_rows_backward(g, v, scale, n, c);
  const auto loss = [&](std::vector<float> x) {
    clip_rows(x, n, c);
    double s = 0;
    for (std::size_t k = 0; k < x.size(); ++k) s += double(w[k]) * x[k];
    return s;
  };
  for (std::size_t k = 0; k < before.size(); ++k) {
    auto up = before, down = before;
    const float h = 1e-3f;
    up[k] += h;
    down[k] -= h;
    const double fd = (loss(up) - loss(down)) / (2.0 * h);
    CHECK(g[k] == doctest::Approx(fd).epsilon(2e-2).scale(1.0));
  }
  CHECK(error_of([&] { clip_rows(v, n, 0.0); }).find("clipping bound") != std::string::npos);
  CHECK(error_of([&] { clip_rows(v, 7, 1.0); }).find("not 7 rows") != std::string::npos);
}

TEST_CASE("distance correlation equals Szekely's definition, is 1 for an affine image, and its gradient is exact") {
  const std::int64_t n = 12, dx = 4, dz = 3;
  const auto x = gaussian(n * dx, 3);
  auto z = gaussian(n * dz, 4);
  CHECK(distance_correlation(x, dx, z, dz, n) == doctest::Approx(dcor_by_definition(x, dx, z, dz, n)).epsilon(1e-6));
  std::vector<float> affine(x.size());
  for (std::size_t k = 0; k < x.size(); ++k) affine[k] = 3.0f * x[k] + 1.0f;
  CHECK(distance_correlation(x, dx, affine, dx, n) == doctest::Approx(1.0).epsilon(1e-5));
  // A z that depends on x (not linearly) scores well above an independent one.
  {
    const std::int64_t m = 64;
    const auto xm = gaussian(m * dx, 8), zm = gaussian(m * dz, 9);
    std::vector<float> dep(static_cast<std::size_t>(m * dz));
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t k = 0; k < dz; ++k) dep[i * dz + k] = std::tanh(2.0f * xm[i * dx + k]) + 0.1f * zm[i * dz + k];
    const double indep = distance_correlation(xm, dx, zm, dz, m), dependent = distance_correlation(xm, dx, dep, dz, m);
    INFO("independent " << indep << ", dependent " << dependent);
    CHECK(dependent > indep + 0.2);
  }
  // Constant z: no spread, 0 and a zero gradient.
  std::vector<float> flat(static_cast<std::size_t>(n * dz), 2.0f), gflat(flat.size(), 7.0f);
  CHECK(distance_correlation(x, dx, flat, dz, n, gflat) == 0.0);
  CHECK(gflat[0] == 0.0f);

  std::vector<float> g(z.size());
  distance_correlation(x, dx, z, dz, n, g);
  for (std::size_t k = 0; k < z.size(); ++k) {
    auto up = z, down = z;
    const float h = 1e-3f;
    up[k] += h;
    down[k] -= h;
    const double fd = (distance_correlation(x, dx, up, dz, n) - distance_correlation(x, dx, down, dz, n)) / (2.0 * h);
    CHECK(g[k] == doctest::Approx(fd).epsilon(2e-2).scale(0.05));
  }
  CHECK(error_of([&] { distance_correlation(x, dx, z, dz, n + 1); }).find("do not match") != std::string::npos);
}

TEST_CASE("label alignment is high for gradients that follow the labels and near 0 for ones that do not") {
  const std::int64_t n = 64, d = 40, k = 10;
  const auto proto = gaussian(k * d, 5);
  std::vector<std::int32_t> y(n);
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<std::int32_t>((i * 7) % k);
  auto g = gaussian(n * d, 6, 0.5f);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t c = 0; c < d; ++c) g[i * d + c] += proto[y[i] * d + c];
  CHECK(label_alignment(g, n, y) > 0.5);
  double unrelated = 0;
  for (std::uint32_t s = 0; s < 8; ++s) unrelated += label_alignment(gaussian(n * d, 10 + s), n, y) / 8;
  CHECK(std::abs(unrelated) < 0.03);
  std::vector<std::int32_t> one(n, 3);
  CHECK(std::isnan(label_alignment(g, n, one)));
  std::vector<float> zero(static_cast<std::size_t>(n * d), 0.0f);
  CHECK(std::isnan(label_alignment(zero, n, y)));

  gradient_monitor m(4, 0.1);
  for (double a : {0.5, 0.4, std::nan(""), 0.3}) m.add(a);
  CHECK_FALSE(m.ready());
  m.add(0.2);
  CHECK(m.ready());
  CHECK(m.mean() == doctest::Approx(0.35));
  CHECK_FALSE(m.suspicious());
  for (int i = 0; i < 4; ++i) m.add(0.01);  // the ring forgets the honest start
  CHECK(m.mean() == doctest::Approx(0.01));
  CHECK(m.suspicious());
}

TEST_CASE("the Renyi DP accountant bounds the exact privacy of composed Gaussian mechanisms, and is not loose") {
  for (const double z : {0.8, 2.0, 5.0})
    for (const std::uint64_t k : {1u, 4u, 30u}) {
      rdp_accountant acc;
      acc.add_gaussian(z, k);
      const double delta = 1e-5;
      const double eps = acc.epsilon(delta);
      // k releases with noise multiplier z compose to one with mu = sqrt(k) / z.
      const double mu = std::sqrt(double(k)) / z;
      INFO("z " << z << " k " << k << " eps " << eps << " exact " << exact_epsilon(mu, delta));
      CHECK(exact_delta(mu, eps) <= delta * (1 + 1e-9));  // a valid bound
      CHECK(eps <= 1.5 * exact_epsilon(mu, delta) + 0.05);
      // Adding the same releases one at a time gives the same.
      rdp_accountant step;
      for (std::uint64_t i = 0; i < k; ++i) step.add_gaussian(z);
      CHECK(step.epsilon(delta) == doctest::Approx(eps));
    }
  rdp_accountant a, b;
  a.add_gaussian(1.0, 10);
  b.add_gaussian(2.0, 10);
  CHECK(b.epsilon(1e-5) < a.epsilon(1e-5));
  CHECK(a.epsilon(1e-3) < a.epsilon(1e-5));
  rdp_accountant none;
  CHECK(none.epsilon(1e-5) == 0.0);
  none.add_gaussian(0.0, 1);
  CHECK(std::isinf(none.epsilon(1e-5)));
  CHECK(error_of([&] { a.epsilon(0.0); }).find("delta") != std::string::npos);
}
