// Image quality of reconstructions, for the privacy benches: PSNR and SSIM of images with
// values in [0, 1].
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace cleave::bench {

inline double psnr(const float* a, const float* b, std::int64_t n) {
  double mse = 0;
  for (std::int64_t k = 0; k < n; ++k) mse += double(a[k] - b[k]) * (a[k] - b[k]);
  return 10.0 * std::log10(1.0 / std::max(mse / static_cast<double>(n), 1e-12));
}

// Mean SSIM over 7x7 windows (uniform, stride 1) of h x w images (Wang et al., 2004).
inline double ssim(const float* a, const float* b, int h, int w) {
  const double c1 = 0.01 * 0.01, c2 = 0.03 * 0.03;
  constexpr int win = 7;
  constexpr double m = win * win;
  double sum = 0;
  int n = 0;
  for (int y = 0; y + win <= h; ++y)
    for (int x = 0; x + win <= w; ++x) {
      double ma = 0, mb = 0, vaa = 0, vbb = 0, vab = 0;
      for (int j = 0; j < win; ++j)
        for (int i = 0; i < win; ++i) {
          const double p = a[(y + j) * w + x + i], q = b[(y + j) * w + x + i];
          ma += p, mb += q, vaa += p * p, vbb += q * q, vab += p * q;
        }
      ma /= m, mb /= m;
      vaa = vaa / m - ma * ma, vbb = vbb / m - mb * mb, vab = vab / m - ma * mb;
      sum += ((2 * ma * mb + c1) * (2 * vab + c2)) / ((ma * ma + mb * mb + c1) * (vaa + vbb + c2));
      ++n;
    }
  return n ? sum / n : 0.0;
}

}  // namespace cleave::bench
