// Reference backend: direct convolution and pooling loops.
#include <cmath>
#include <limits>

#include "reference_backend.h"

namespace cleave::backend::detail {

using core::tensor;

namespace {

using core::conv_dims;

}  // namespace

void reference_backend::conv2d_forward(const core::conv2d_desc& d, const tensor& x, const tensor& w, const tensor& b,
                                       const tensor& y) {
  const auto c = core::conv_dims_of(d, x, w, y);
  const float *px = x.f32(), *pw = w.f32(), *pb = b.defined() ? b.f32() : nullptr;
  float* py = y.f32();
  for (std::int64_t n = 0; n < c.n; ++n)
    for (std::int64_t k = 0; k < c.k; ++k)
      for (std::int64_t p = 0; p < c.p; ++p)
        for (std::int64_t q = 0; q < c.q; ++q) {
          double acc = pb ? pb[k] : 0.0;
          const std::int64_t c0 = k / c.kg() * c.cg();  // the first input channel of k's group
          for (std::int64_t j = 0; j < c.cg(); ++j)
            for (std::int64_t r = 0; r < c.r; ++r) {
              const std::int64_t ih = p * d.stride_h - d.pad_h + r;
              if (ih < 0 || ih >= c.h) continue;
              for (std::int64_t s = 0; s < c.s; ++s) {
                const std::int64_t iw = q * d.stride_w - d.pad_w + s;
                if (iw < 0 || iw >= c.w) continue;
                acc += static_cast<double>(px[((n * c.c + c0 + j) * c.h + ih) * c.w + iw]) *
                       pw[((k * c.cg() + j) * c.r + r) * c.s + s];
              }
            }
          py[((n * c.k + k) * c.p + p) * c.q + q] = static_cast<float>(acc);
        }
}

void reference_backend::conv2d_backward_data(const core::conv2d_desc& d, const tensor& dy, const tensor& w,
                                             const tensor& dx) {
  const auto c = core::conv_dims_of(d, dx, w, dy);
  const float *pdy = dy.f32(), *pw = w.f32();
  float* pdx = dx.f32();
  // Gather form: every input element sums the outputs whose window covers it.
  for (std::int64_t n = 0; n < c.n; ++n)
    for (std::int64_t ch = 0; ch < c.c; ++ch)
      for (std::int64_t ih = 0; ih < c.h; ++ih)
        for (std::int64_t iw = 0; iw < c.w; ++iw) {
          double acc = 0.0;
          // The output channels of ch's group, and ch's index within its group.
          const std::int64_t k0 = ch / c.cg() * c.kg(), j = ch % c.cg();
          for (std::int64_t k = k0; k < k0 + c.kg(); ++k)
            for (std::int64_t r = 0; r < c.r; ++r) {
              const std::int64_t ph = ih + d.pad_h - r;
              if (ph < 0 || ph % d.stride_h) continue;
              const std::int64_t p = ph / d.stride_h;
              if (p >= c.p) continue;
              for (std::int64_t s = 0; s < c.s; ++s) {
                const std::int64_t qw = iw + d.pad_w - s;
                if (qw < 0 || qw % d.stride_w) continue;
                const std::int64_t q = qw / d.stride_w;
                if (q >= c.q) continue;
                acc += static_cast<double>(pdy[((n * c.k + k) * c.p + p) * c.q + q]) *
                       pw[((k * c.cg() + j) * c.r + r) * c.s + s];
              }
            }
          pdx[((n * c.c + ch) * c.h + ih) * c.w + iw] = static_cast<float>(acc);
        }
}

void reference_backend::conv2d_backward_weights(const core::conv2d_desc& d, const tensor& x, const tensor& dy,
                                                const tensor& dw, const tensor& db) {
  const auto c = core::conv_dims_of(d, x, dw, dy);
  const float *px = x.f32(), *pdy = dy.f32();
  float* pdw = dw.f32();
  for (std::int64_t k = 0; k < c.k; ++k)
    for (std::int64_t j = 0; j < c.cg(); ++j)
      for (std::int64_t r = 0; r < c.r; ++r)
        for (std::int64_t s = 0; s < c.s; ++s) {
          const std::int64_t ch = k / c.kg() * c.cg() + j;
          double acc = 0.0;
          for (std::int64_t n = 0; n < c.n; ++n)
            for (std::int64_t p = 0; p < c.p; ++p) {
              const std::int64_t ih = p * d.stride_h - d.pad_h + r;
              if (ih < 0 || ih >= c.h) continue;
              for (std::int64_t q = 0; q < c.q; ++q) {
                const std::int64_t iw = q * d.stride_w - d.pad_w + s;
                if (iw < 0 || iw >= c.w) continue;
                acc += static_cast<double>(pdy[((n * c.k + k) * c.p + p) * c.q + q]) *
                       px[((n * c.c + ch) * c.h + ih) * c.w + iw];
              }
            }
          pdw[((k * c.cg() + j) * c.r + r) * c.s + s] += static_cast<float>(acc);
        }
  if (db.defined()) {
    float* pdb = db.f32();
    for (std::int64_t k = 0; k < c.k; ++k) {
      double acc = 0.0;
      for (std::int64_t n = 0; n < c.n; ++n)
        for (std::int64_t j = 0; j < c.p * c.q; ++j) acc += pdy[(n * c.k + k) * c.p * c.q + j];
      pdb[k] += static_cast<float>(acc);
    }
  }
}

void reference_backend::pool2d_forward(const core::pool2d_desc& d, const tensor& x, const tensor& y, tensor* ws) {
  const auto &xs = x.shape(), &ys = y.shape();
  CLEAVE_ASSERT(xs.rank() == 4 && ys.rank() == 4 && xs[0] == ys[0] && xs[1] == ys[1], "pool2d shapes");
  const std::int64_t nc = xs[0] * xs[1], h = xs[2], w = xs[3], ph = ys[2], pw = ys[3];
  CLEAVE_ASSERT(ph == core::window_out(h, d.kernel_h, d.stride_h, d.pad_h) &&
                    pw == core::window_out(w, d.kernel_w, d.stride_w, d.pad_w),
                "pool2d output size mismatch");
  const bool is_max = d.kind == core::pool_kind::max;
  std::int32_t* idx = nullptr;
  if (ws && is_max) {
    *ws = empty(ys, core::dtype::i32);  // argmax as an offset into the (H,W) plane
    idx = ws->host<std::int32_t>();
  }
  const float* px = x.f32();
  float* py = y.f32();
  const double area = static_cast<double>(d.kernel_h) * d.kernel_w;
  for (std::int64_t plane = 0; plane < nc; ++plane)
    for (std::int64_t p = 0; p < ph; ++p)
      for (std::int64_t q = 0; q < pw; ++q) {
        float best = -std::numeric_limits<float>::infinity();
        std::int32_t best_at = -1;
        double sum = 0.0;
        for (int r = 0; r < d.kernel_h; ++r) {
          const std::int64_t ih = p * d.stride_h - d.pad_h + r;
          if (ih < 0 || ih >= h) continue;
          for (int s = 0; s < d.kernel_w; ++s) {
            const std::int64_t iw = q * d.stride_w - d.pad_w + s;
            if (iw < 0 || iw >= w) continue;
            const float v = px[(plane * h + ih) * w + iw];
            if (best_at < 0 || v > best) {
              best = v;
              best_at = static_cast<std::int32_t>(ih * w + iw);
            }
            sum += v;
          }
        }
        const std::int64_t o = (plane * ph + p) * pw + q;
        py[o] = is_max ? best : static_cast<float>(sum / area);
        if (idx) idx[o] = best_at;
      }
}

void reference_backend::pool2d_backward(const core::pool2d_desc& d, const tensor& x, const tensor& dy, const tensor& ws,
                                        const tensor& dx) {
  const auto &xs = dx.shape(), &ys = dy.shape();
  const std::int64_t nc = xs[0] * xs[1], h = xs[2], w = xs[3], ph = ys[2], pw = ys[3];
  const float* pdy = dy.f32();
  float* pdx = dx.f32();
  std::fill_n(pdx, dx.numel(), 0.0f);
  if (d.kind == core::pool_kind::max) {
    CLEAVE_ASSERT(ws.defined() && ws.dtype() == core::dtype::i32, "max pool backward needs the forward workspace");
    const auto* idx = ws.host<std::int32_t>();
    for (std::int64_t plane = 0; plane < nc; ++plane)
      for (std::int64_t j = 0; j < ph * pw; ++j) {
        const std::int32_t at = idx[plane * ph * pw + j];
        if (at >= 0) pdx[plane * h * w + at] += pdy[plane * ph * pw + j];
      }
    return;
  }
  const float inv_area = 1.0f / static_cast<float>(d.kernel_h * d.kernel_w);
  for (std::int64_t plane = 0; plane < nc; ++plane)
    for (std::int64_t p = 0; p < ph; ++p)
      for (std::int64_t q = 0; q < pw; ++q) {
        const float g = pdy[(plane * ph + p) * pw + q] * inv_area;
        for (int r = 0; r < d.kernel_h; ++r) {
          const std::int64_t ih = p * d.stride_h - d.pad_h + r;
          if (ih < 0 || ih >= h) continue;
          for (int s = 0; s < d.kernel_w; ++s) {
            const std::int64_t iw = q * d.stride_w - d.pad_w + s;
            if (iw >= 0 && iw < w) pdx[(plane * h + ih) * w + iw] += g;
          }
        }
      }
}

}  // namespace cleave::backend::detail
