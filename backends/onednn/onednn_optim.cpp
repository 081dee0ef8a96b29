// oneDNN backend: optimizer updates as vectorisable loops (oneDNN has no optimizer primitives),
// split over the backend's threads when the buffer is large. The arithmetic per element is the
// reference backend's, in the same order.
#include <omp.h>

#include <cmath>

#include "onednn_backend.h"

namespace cleave::backend::detail {

using core::tensor;

int onednn_backend::threads_for(double work) const {
  return work >= min_parallel_work_ ? n_threads_ : 1;
}

void onednn_backend::sgd_update(const core::sgd_desc& d, const tensor& param, const tensor& grad,
                                const tensor& momentum_buf) {
  core::expect_f32(*this, param, "sgd_update: param");
  core::expect_f32(*this, grad, "sgd_update: grad");
  CLEAVE_ASSERT(param.numel() == grad.numel(), "sgd_update: param and grad differ in size");
  row_major({&param, &grad, &momentum_buf});
  const bool use_buf = d.momentum != 0.0f;
  if (use_buf) {
    core::expect_f32(*this, momentum_buf, "sgd_update: momentum_buf");
    CLEAVE_ASSERT(momentum_buf.numel() == param.numel(), "sgd_update: momentum_buf differs in size");
  }
  const std::int64_t n = param.numel();
  float* __restrict p = param.f32();
  const float* __restrict g = grad.f32();
  float* __restrict buf = use_buf ? momentum_buf.f32() : nullptr;
  const float lr = d.lr, wd = d.weight_decay, mom = d.momentum;
  const int nt = threads_for(4.0 * (use_buf ? 20 : 12) * static_cast<double>(n));
  if (!use_buf) {
#pragma omp parallel for simd num_threads(nt) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
  } else if (d.nesterov) {
#pragma omp parallel for simd num_threads(nt) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const float gi = g[i] + wd * p[i];
      const float b = mom * buf[i] + gi;
      buf[i] = b;
      p[i] -= lr * (gi + mom * b);
    }
  } else {
#pragma omp parallel for simd num_threads(nt) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const float b = mom * buf[i] + (g[i] + wd * p[i]);
      buf[i] = b;
      p[i] -= lr * b;
    }
  }
}

void onednn_backend::adamw_update(const core::adamw_desc& d, const tensor& param, const tensor& grad, const tensor& m,
                                  const tensor& v) {
  core::expect_f32(*this, param, "adamw_update: param");
  core::expect_f32(*this, grad, "adamw_update: grad");
  core::expect_f32(*this, m, "adamw_update: m");
  core::expect_f32(*this, v, "adamw_update: v");
  row_major({&param, &grad, &m, &v});
  CLEAVE_ASSERT(param.numel() == grad.numel() && param.numel() == m.numel() && param.numel() == v.numel(),
                "adamw_update: param, grad, m and v differ in size");
  const std::int64_t n = param.numel();
  float* __restrict p = param.f32();
  float* __restrict pm = m.f32();
  float* __restrict pv = v.f32();
  const float* __restrict g = grad.f32();
  const double bc1 = 1.0 - std::pow(static_cast<double>(d.beta1), static_cast<double>(d.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(d.beta2), static_cast<double>(d.step));
  const float step_size = static_cast<float>(d.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - d.lr * d.weight_decay;
  const float b1 = d.beta1, b2 = d.beta2, eps = d.eps;
  const int nt = threads_for(4.0 * 28 * static_cast<double>(n));
#pragma omp parallel for simd num_threads(nt) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const float pi = p[i] * decay;
    const float mi = b1 * pm[i] + (1.0f - b1) * g[i];
    const float vi = b2 * pv[i] + (1.0f - b2) * g[i] * g[i];
    pm[i] = mi;
    pv[i] = vi;
    p[i] = pi - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
  }
}

}  // namespace cleave::backend::detail
