// Reference backend: memory, element-wise ops, dense layers, batch norm, loss, optimizers.
// Convolution and pooling are in reference_conv.cpp.
#include "reference_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cleave/core/convert.h"
#include "cleave/core/random.h"
#include "factory.h"
#include "host_buffer.h"

namespace cleave::backend::detail {

using core::tensor;

namespace {

void same_numel(const tensor& a, const tensor& b, const char* op) {
  CLEAVE_ASSERT(a.numel() == b.numel(),
                std::string(op) + ": element counts differ: " + a.shape().str() + " vs " + b.shape().str());
}

float load_as_f32(const tensor& t, std::int64_t i) {
  const void* p = t.host_data();
  switch (t.dtype()) {
    case core::dtype::f32:
      return static_cast<const float*>(p)[i];
    case core::dtype::f16:
      return core::f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    case core::dtype::bf16:
      return core::bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    case core::dtype::i8:
      return static_cast<float>(static_cast<const std::int8_t*>(p)[i]);
    case core::dtype::u8:
      return static_cast<float>(static_cast<const std::uint8_t*>(p)[i]);
    case core::dtype::i32:
      return static_cast<float>(static_cast<const std::int32_t*>(p)[i]);
  }
  return 0.0f;
}

void store_from_f32(const tensor& t, std::int64_t i, float v) {
  void* p = t.host_data();
  switch (t.dtype()) {
    case core::dtype::f32:
      static_cast<float*>(p)[i] = v;
      break;
    case core::dtype::f16:
      static_cast<std::uint16_t*>(p)[i] = core::f32_to_f16(v);
      break;
    case core::dtype::bf16:
      static_cast<std::uint16_t*>(p)[i] = core::f32_to_bf16(v);
      break;
    case core::dtype::i8:
      static_cast<std::int8_t*>(p)[i] = static_cast<std::int8_t>(core::f32_to_int_sat(v, -128, 127));
      break;
    case core::dtype::u8:
      static_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(core::f32_to_int_sat(v, 0, 255));
      break;
    case core::dtype::i32:
      static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(
          core::f32_to_int_sat(v, std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max()));
      break;
  }
}

// (N,C,H,W) or (N,C): n, c and the spatial size per channel.
struct nc_hw {
  std::int64_t n, c, hw;
};
nc_hw split_nc(const tensor& x) {
  const auto& s = x.shape();
  CLEAVE_ASSERT(s.rank() == 2 || s.rank() == 4, "batch norm input must be (N,C) or (N,C,H,W), got " + s.str());
  return {s[0], s[1], s.rank() == 4 ? s[2] * s[3] : 1};
}

}  // namespace

void reference_backend::release_cached_memory() {
  synchronize();  // work still in flight (onednn's stream) may free blocks into the cache
  detail::host_cache_release();
}

core::buffer_ptr reference_backend::allocate(std::size_t bytes) {
  return std::make_shared<host_buffer>(this, bytes);
}

void reference_backend::upload(const tensor& dst, const void* src) {
  if (dst.bytes()) std::memcpy(dst.host_data(), src, dst.bytes());
}

void reference_backend::download(const tensor& src, void* dst) {
  if (src.bytes()) std::memcpy(dst, src.host_data(), src.bytes());
}

void reference_backend::fill(const tensor& t, float value) {
  core::expect_f32(*this, t, "fill: t");
  std::fill_n(t.f32(), t.numel(), value);
}

void reference_backend::copy(const tensor& src, const tensor& dst) {
  CLEAVE_ASSERT(src.dtype() == dst.dtype(), "copy: dtypes differ");
  same_numel(src, dst, "copy");
  if (src.bytes()) std::memmove(dst.host_data(), src.host_data(), src.bytes());
}

void reference_backend::cast(const tensor& src, const tensor& dst) {
  same_numel(src, dst, "cast");
  if (src.dtype() == dst.dtype()) return copy(src, dst);
  const std::int64_t n = src.numel();
  if (src.dtype() == core::dtype::i32 && dst.dtype() != core::dtype::f32 && dst.dtype() != core::dtype::f16 &&
      dst.dtype() != core::dtype::bf16) {
    // Integer to integer: saturate without a trip through float (exact for all i32).
    const auto* s = src.host<std::int32_t>();
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t v = s[i];
      if (dst.dtype() == core::dtype::i8)
        dst.host<std::int8_t>()[i] = static_cast<std::int8_t>(std::clamp<std::int64_t>(v, -128, 127));
      else
        dst.host<std::uint8_t>()[i] = static_cast<std::uint8_t>(std::clamp<std::int64_t>(v, 0, 255));
    }
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) store_from_f32(dst, i, load_as_f32(src, i));
}

void reference_backend::add(const tensor& a, const tensor& b, const tensor& y) {
  same_numel(a, y, "add");
  same_numel(b, y, "add");
  const float *pa = a.f32(), *pb = b.f32();
  float* py = y.f32();
  for (std::int64_t i = 0, n = y.numel(); i < n; ++i) py[i] = pa[i] + pb[i];
}

void reference_backend::mul(const tensor& a, const tensor& b, const tensor& y) {
  same_numel(a, y, "mul");
  same_numel(b, y, "mul");
  const float *pa = a.f32(), *pb = b.f32();
  float* py = y.f32();
  for (std::int64_t i = 0, n = y.numel(); i < n; ++i) py[i] = pa[i] * pb[i];
}

void reference_backend::axpy(float alpha, const tensor& x, const tensor& y) {
  same_numel(x, y, "axpy");
  const float* px = x.f32();
  float* py = y.f32();
  for (std::int64_t i = 0, n = y.numel(); i < n; ++i) py[i] += alpha * px[i];
}

void reference_backend::scale(const tensor& y, float alpha) {
  float* py = y.f32();
  for (std::int64_t i = 0, n = y.numel(); i < n; ++i) py[i] *= alpha;
}

void reference_backend::relu_forward(const tensor& x, const tensor& y) {
  same_numel(x, y, "relu_forward");
  const float* px = x.f32();
  float* py = y.f32();
  for (std::int64_t i = 0, n = y.numel(); i < n; ++i) py[i] = px[i] > 0.0f ? px[i] : 0.0f;
}

void reference_backend::relu_backward(const tensor& y, const tensor& dy, const tensor& dx) {
  same_numel(y, dy, "relu_backward");
  same_numel(dy, dx, "relu_backward");
  const float *py = y.f32(), *pdy = dy.f32();
  float* pdx = dx.f32();
  for (std::int64_t i = 0, n = dx.numel(); i < n; ++i) pdx[i] = py[i] > 0.0f ? pdy[i] : 0.0f;
}

void reference_backend::clamp_forward(const tensor& x, const tensor& y, float lo, float hi) {
  same_numel(x, y, "clamp_forward");
  CLEAVE_ASSERT(lo < hi, "clamp_forward: lo must be below hi");
  const float* px = x.f32();
  float* py = y.f32();
  for (std::int64_t i = 0, n = y.numel(); i < n; ++i) py[i] = std::min(std::max(px[i], lo), hi);
}

void reference_backend::clamp_backward(const tensor& y, const tensor& dy, const tensor& dx, float lo, float hi) {
  same_numel(y, dy, "clamp_backward");
  same_numel(dy, dx, "clamp_backward");
  const float *py = y.f32(), *pdy = dy.f32();
  float* pdx = dx.f32();
  for (std::int64_t i = 0, n = dx.numel(); i < n; ++i) pdx[i] = py[i] > lo && py[i] < hi ? pdy[i] : 0.0f;
}

void reference_backend::dropout_forward(const tensor& x, const tensor& y, const tensor& mask, float p,
                                        std::uint32_t seed) {
  same_numel(x, y, "dropout_forward");
  same_numel(x, mask, "dropout_forward");
  CLEAVE_ASSERT(p >= 0.0f && p < 1.0f, "dropout probability out of [0,1)");
  const std::uint32_t thr = core::dropout_threshold(p);
  const float keep_scale = 1.0f / (1.0f - p);
  const float* px = x.f32();
  float *py = y.f32(), *pm = mask.f32();
  for (std::int64_t i = 0, n = x.numel(); i < n; ++i) {
    pm[i] = core::dropout_keep(seed, static_cast<std::uint32_t>(i), thr) ? keep_scale : 0.0f;
    py[i] = px[i] * pm[i];
  }
}

void reference_backend::matmul(const tensor& a, const tensor& b, const tensor& c, bool trans_a, bool trans_b,
                               float alpha, float beta) {
  CLEAVE_ASSERT(a.shape().rank() == 2 && b.shape().rank() == 2 && c.shape().rank() == 2, "matmul needs 2-D tensors");
  const std::int64_t m = c.shape()[0], n = c.shape()[1];
  const std::int64_t k = trans_a ? a.shape()[0] : a.shape()[1];
  CLEAVE_ASSERT((trans_a ? a.shape()[1] : a.shape()[0]) == m, "matmul: a rows");
  CLEAVE_ASSERT((trans_b ? b.shape()[1] : b.shape()[0]) == k && (trans_b ? b.shape()[0] : b.shape()[1]) == n,
                "matmul: b shape");
  const float *pa = a.f32(), *pb = b.f32();
  float* pc = c.f32();
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        const float av = trans_a ? pa[p * m + i] : pa[i * k + p];
        const float bv = trans_b ? pb[j * k + p] : pb[p * n + j];
        acc += static_cast<double>(av) * bv;
      }
      const float prev = beta == 0.0f ? 0.0f : beta * pc[i * n + j];
      pc[i * n + j] = alpha * static_cast<float>(acc) + prev;
    }
}

void reference_backend::linear_forward(const tensor& x, const tensor& w, const tensor& b, const tensor& y) {
  const std::int64_t n = x.shape()[0], in = w.shape()[1], out = w.shape()[0];
  CLEAVE_ASSERT(x.numel() == n * in && y.numel() == n * out, "linear_forward shapes");
  const float *px = x.f32(), *pw = w.f32(), *pb = b.defined() ? b.f32() : nullptr;
  float* py = y.f32();
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t o = 0; o < out; ++o) {
      double acc = pb ? pb[o] : 0.0;
      for (std::int64_t k = 0; k < in; ++k) acc += static_cast<double>(px[i * in + k]) * pw[o * in + k];
      py[i * out + o] = static_cast<float>(acc);
    }
}

void reference_backend::linear_backward_data(const tensor& dy, const tensor& w, const tensor& dx) {
  const std::int64_t n = dy.shape()[0], in = w.shape()[1], out = w.shape()[0];
  CLEAVE_ASSERT(dy.numel() == n * out && dx.numel() == n * in, "linear_backward_data shapes");
  const float *pdy = dy.f32(), *pw = w.f32();
  float* pdx = dx.f32();
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t k = 0; k < in; ++k) {
      double acc = 0.0;
      for (std::int64_t o = 0; o < out; ++o) acc += static_cast<double>(pdy[i * out + o]) * pw[o * in + k];
      pdx[i * in + k] = static_cast<float>(acc);
    }
}

void reference_backend::linear_backward_weights(const tensor& x, const tensor& dy, const tensor& dw, const tensor& db) {
  const std::int64_t n = dy.shape()[0], in = dw.shape()[1], out = dw.shape()[0];
  CLEAVE_ASSERT(dy.numel() == n * out && x.numel() == n * in, "linear_backward_weights shapes");
  const float *px = x.f32(), *pdy = dy.f32();
  float* pdw = dw.f32();
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t k = 0; k < in; ++k) {
      double acc = 0.0;
      for (std::int64_t i = 0; i < n; ++i) acc += static_cast<double>(pdy[i * out + o]) * px[i * in + k];
      pdw[o * in + k] += static_cast<float>(acc);
    }
  if (db.defined()) {
    float* pdb = db.f32();
    for (std::int64_t o = 0; o < out; ++o) {
      double acc = 0.0;
      for (std::int64_t i = 0; i < n; ++i) acc += pdy[i * out + o];
      pdb[o] += static_cast<float>(acc);
    }
  }
}

void reference_backend::batchnorm_forward_train(const core::batchnorm_desc& d, const tensor& x, const tensor& gamma,
                                                const tensor& beta, const tensor& y, const tensor& save_mean,
                                                const tensor& save_invstd, const tensor& running_mean,
                                                const tensor& running_var) {
  const auto [n, c, hw] = split_nc(x);
  const float *px = x.f32(), *pg = gamma.f32(), *pb = beta.f32();
  float *py = y.f32(), *pm = save_mean.f32(), *pi = save_invstd.f32();
  float *prm = running_mean.f32(), *prv = running_var.f32();
  const double count = static_cast<double>(n * hw);
  for (std::int64_t ch = 0; ch < c; ++ch) {
    double sum = 0.0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < hw; ++j) sum += px[(i * c + ch) * hw + j];
    const double mean = sum / count;
    double sq = 0.0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < hw; ++j) {
        const double dv = px[(i * c + ch) * hw + j] - mean;
        sq += dv * dv;
      }
    const double var = sq / count;
    const double invstd = 1.0 / std::sqrt(var + d.eps);
    pm[ch] = static_cast<float>(mean);
    pi[ch] = static_cast<float>(invstd);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < hw; ++j) {
        const std::int64_t k = (i * c + ch) * hw + j;
        py[k] = static_cast<float>(pg[ch] * (px[k] - mean) * invstd + pb[ch]);
      }
    const double unbiased = count > 1 ? var * count / (count - 1) : var;
    prm[ch] = static_cast<float>((1.0 - d.momentum) * prm[ch] + d.momentum * mean);
    prv[ch] = static_cast<float>((1.0 - d.momentum) * prv[ch] + d.momentum * unbiased);
  }
}

void reference_backend::batchnorm_forward_infer(const core::batchnorm_desc& d, const tensor& x, const tensor& gamma,
                                                const tensor& beta, const tensor& running_mean,
                                                const tensor& running_var, const tensor& y) {
  const auto [n, c, hw] = split_nc(x);
  const float *px = x.f32(), *pg = gamma.f32(), *pb = beta.f32(), *prm = running_mean.f32(), *prv = running_var.f32();
  float* py = y.f32();
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t ch = 0; ch < c; ++ch) {
      const double invstd = 1.0 / std::sqrt(static_cast<double>(prv[ch]) + d.eps);
      for (std::int64_t j = 0; j < hw; ++j) {
        const std::int64_t k = (i * c + ch) * hw + j;
        py[k] = static_cast<float>(pg[ch] * (px[k] - prm[ch]) * invstd + pb[ch]);
      }
    }
}

void reference_backend::batchnorm_backward(const core::batchnorm_desc&, const tensor& x, const tensor& dy,
                                           const tensor& gamma, const tensor& save_mean, const tensor& save_invstd,
                                           const tensor& dx, const tensor& dgamma, const tensor& dbeta) {
  const auto [n, c, hw] = split_nc(x);
  const float *px = x.f32(), *pdy = dy.f32(), *pg = gamma.f32(), *pm = save_mean.f32(), *pi = save_invstd.f32();
  float *pdx = dx.f32(), *pdg = dgamma.f32(), *pdb = dbeta.f32();
  const double count = static_cast<double>(n * hw);
  for (std::int64_t ch = 0; ch < c; ++ch) {
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < hw; ++j) {
        const std::int64_t k = (i * c + ch) * hw + j;
        const double xhat = (px[k] - pm[ch]) * static_cast<double>(pi[ch]);
        sum_dy += pdy[k];
        sum_dy_xhat += pdy[k] * xhat;
      }
    // dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat))
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < hw; ++j) {
        const std::int64_t k = (i * c + ch) * hw + j;
        const double xhat = (px[k] - pm[ch]) * static_cast<double>(pi[ch]);
        pdx[k] = static_cast<float>(pg[ch] * pi[ch] * (pdy[k] - sum_dy / count - xhat * sum_dy_xhat / count));
      }
    pdg[ch] += static_cast<float>(sum_dy_xhat);
    pdb[ch] += static_cast<float>(sum_dy);
  }
}

void reference_backend::softmax_xent_forward(const tensor& logits, const tensor& labels, const tensor& probs,
                                             const tensor& loss) {
  const std::int64_t n = logits.shape()[0], k = logits.shape()[1];
  CLEAVE_ASSERT(labels.dtype() == core::dtype::i32 && labels.numel() == n, "softmax_xent: labels must be (N) i32");
  const float* pl = logits.f32();
  const auto* plab = labels.host<std::int32_t>();
  float* pp = probs.f32();
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = pl + i * k;
    const float mx = *std::max_element(row, row + k);
    double sum = 0.0;
    for (std::int64_t j = 0; j < k; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
    for (std::int64_t j = 0; j < k; ++j)
      pp[i * k + j] = static_cast<float>(std::exp(static_cast<double>(row[j]) - mx) / sum);
    const std::int32_t lab = plab[i];
    CLEAVE_ASSERT(lab >= 0 && lab < k, "label out of range");
    total += -(static_cast<double>(row[lab]) - mx - std::log(sum));
  }
  loss.f32()[0] = static_cast<float>(total / static_cast<double>(n));
}

void reference_backend::softmax_xent_backward(const tensor& probs, const tensor& labels, const tensor& dlogits,
                                              float scale) {
  const std::int64_t n = probs.shape()[0], k = probs.shape()[1];
  const float* pp = probs.f32();
  const auto* plab = labels.host<std::int32_t>();
  float* pd = dlogits.f32();
  const float s = scale / static_cast<float>(n);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < k; ++j) pd[i * k + j] = (pp[i * k + j] - (j == plab[i] ? 1.0f : 0.0f)) * s;
}

void reference_backend::sgd_update(const core::sgd_desc& d, const tensor& param, const tensor& grad,
                                   const tensor& momentum_buf) {
  same_numel(param, grad, "sgd_update");
  float* p = param.f32();
  const float* g = grad.f32();
  float* buf = d.momentum != 0.0f ? momentum_buf.f32() : nullptr;
  for (std::int64_t i = 0, n = param.numel(); i < n; ++i) {
    float gi = g[i] + d.weight_decay * p[i];
    if (buf) {
      buf[i] = d.momentum * buf[i] + gi;
      gi = d.nesterov ? gi + d.momentum * buf[i] : buf[i];
    }
    p[i] -= d.lr * gi;
  }
}

void reference_backend::adamw_update(const core::adamw_desc& d, const tensor& param, const tensor& grad,
                                     const tensor& m, const tensor& v) {
  same_numel(param, grad, "adamw_update");
  float *p = param.f32(), *pm = m.f32(), *pv = v.f32();
  const float* g = grad.f32();
  const double bc1 = 1.0 - std::pow(static_cast<double>(d.beta1), static_cast<double>(d.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(d.beta2), static_cast<double>(d.step));
  const float step_size = static_cast<float>(d.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - d.lr * d.weight_decay;
  for (std::int64_t i = 0, n = param.numel(); i < n; ++i) {
    p[i] *= decay;
    pm[i] = d.beta1 * pm[i] + (1.0f - d.beta1) * g[i];
    pv[i] = d.beta2 * pv[i] + (1.0f - d.beta2) * g[i] * g[i];
    p[i] -= step_size * pm[i] / (std::sqrt(pv[i]) / bc2_sqrt + d.eps);
  }
}

backend_info probe_reference() {
  return {"reference", true, "host CPU (plain loops)", false};
}

std::unique_ptr<core::backend> create_reference(const std::string& device) {
  if (!device.empty()) throw core::error("backend 'reference' takes no device (got ':" + device + "')");
  return std::make_unique<reference_backend>();
}

}  // namespace cleave::backend::detail
