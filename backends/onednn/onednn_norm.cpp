// oneDNN backend: batch normalisation (training, inference, backward). Images (N,C,H,W) are
// normalised here, per channel in parallel over the contiguous (H,W) planes: oneDNN 2.6's kernel
// for plain NCHW ("ncsp") is a scalar loop, 10x slower than these (measured on MobileNetV2's
// 64x96x28x28), and its vectorised kernels want blocked or channels-last layouts, which would
// cost two reorders per call. (N,C) inputs go through oneDNN primitives, with the parts oneDNN
// leaves out done here: 1/sqrt(var + eps), running statistics with the unbiased variance (as
// PyTorch), and accumulation of dgamma and dbeta.
#include <omp.h>

#include <cmath>

#include "dnnl_check.h"
#include "onednn_backend.h"

namespace cleave::backend::detail {

using core::tensor;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using flags = dnnl::normalization_flags;

namespace {

// (N,C,H,W) or (N,C) as oneDNN's 4-D (N,C,H,W).
dnnl::memory::dims bn_dims(const tensor& x) {
  const auto& s = x.shape();
  CLEAVE_ASSERT(s.rank() == 2 || s.rank() == 4, "batch norm input must be (N,C) or (N,C,H,W), got " + s.str());
  return {s[0], s[1], s.rank() == 4 ? s[2] : 1, s.rank() == 4 ? s[3] : 1};
}

void check_channel(const core::backend& b, const tensor& t, std::int64_t c, const char* what) {
  core::expect_f32(b, t, what);
  CLEAVE_ASSERT(t.numel() == c, std::string(what) + " must have C = " + std::to_string(c) + " elements");
}

op_key bn_key(op_tag t, const dnnl::memory::dims& d, float eps) {
  op_key k = make_key(t);
  k << d[0] << d[1] << d[2] << d[3] << eps;
  return k;
}

dnnl::batch_normalization_forward::primitive_desc bn_forward_pd(dnnl::prop_kind prop, const dnnl::memory::desc& md,
                                                                float eps, flags f, const dnnl::engine& eng) {
  return CLEAVE_CHECK_DNNL(
      dnnl::batch_normalization_forward::primitive_desc({prop, md, eps, f}, arena_scratchpad(), eng));
}

// Planes of at least this many values take the direct loops.
constexpr std::int64_t k_min_plane = 4;

float plane_sum(const float* p, std::int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t j = 0; j < n; ++j) s += p[j];
  return s;
}

float plane_centered_squares(const float* p, std::int64_t n, float mean) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t j = 0; j < n; ++j) {
    const float d = p[j] - mean;
    s += d * d;
  }
  return s;
}

}  // namespace

void onednn_backend::batchnorm_forward_train(const core::batchnorm_desc& d, const tensor& x, const tensor& gamma,
                                             const tensor& beta, const tensor& y, const tensor& save_mean,
                                             const tensor& save_invstd, const tensor& running_mean,
                                             const tensor& running_var) {
  core::expect_f32(*this, x, "batchnorm_forward_train: x");
  core::expect_f32(*this, y, "batchnorm_forward_train: y");
  const auto dm = bn_dims(x);
  const std::int64_t c = dm[1], count = dm[0] * dm[2] * dm[3];
  CLEAVE_ASSERT(y.numel() == x.numel(), "batchnorm_forward_train: y must match x");
  check_channel(*this, gamma, c, "batchnorm_forward_train: gamma");
  check_channel(*this, beta, c, "batchnorm_forward_train: beta");
  check_channel(*this, save_mean, c, "batchnorm_forward_train: save_mean");
  check_channel(*this, save_invstd, c, "batchnorm_forward_train: save_invstd");
  check_channel(*this, running_mean, c, "batchnorm_forward_train: running_mean");
  check_channel(*this, running_var, c, "batchnorm_forward_train: running_var");
  if (const int lx = image_layout_of(x); lx != 0 && count > 0 && c > 0) {
    claim(y);
    bn_train_blocked(d, layout_block(lx), dm, x, gamma, beta, y, save_mean, save_invstd, running_mean, running_var);
    return wrote(y, lx);
  }
  claim(y);
  if (count == 0 || c == 0)
    return reference_backend::batchnorm_forward_train(d, x, gamma, beta, y, save_mean, save_invstd, running_mean,
                                                      running_var);
  const std::int64_t n = dm[0], hw = dm[2] * dm[3];
  if (hw >= k_min_plane) {
    const float *px = x.f32(), *pg = gamma.f32(), *pb = beta.f32();
    float *py = y.f32(), *pm = save_mean.f32(), *pi = save_invstd.f32();
    float *prm = running_mean.f32(), *prv = running_var.f32();
    const double cnt = static_cast<double>(count), mom = d.momentum;
    // Per plane in float, across planes in double; the variance from centred squares.
#pragma omp parallel for num_threads(threads_for(4.0 * 16 * x.numel())) schedule(static)
    for (std::int64_t ch = 0; ch < c; ++ch) {
      double sum = 0.0;
      for (std::int64_t i = 0; i < n; ++i) sum += plane_sum(px + (i * c + ch) * hw, hw);
      const double mean = sum / cnt;
      double sq = 0.0;
      for (std::int64_t i = 0; i < n; ++i)
        sq += plane_centered_squares(px + (i * c + ch) * hw, hw, static_cast<float>(mean));
      const double var = sq / cnt, invstd = 1.0 / std::sqrt(var + d.eps);
      pm[ch] = static_cast<float>(mean);
      pi[ch] = static_cast<float>(invstd);
      const float scale = static_cast<float>(pg[ch] * invstd);
      const float shift = static_cast<float>(pb[ch] - mean * pg[ch] * invstd);
      for (std::int64_t i = 0; i < n; ++i) {
        const float* xp = px + (i * c + ch) * hw;
        float* yp = py + (i * c + ch) * hw;
#pragma omp simd
        for (std::int64_t j = 0; j < hw; ++j) yp[j] = xp[j] * scale + shift;
      }
      const double unbiased = count > 1 ? var * cnt / (cnt - 1) : var;
      prm[ch] = static_cast<float>((1.0 - mom) * prm[ch] + mom * mean);
      prv[ch] = static_cast<float>((1.0 - mom) * prv[ch] + mom * unbiased);
    }
    return;
  }
  auto& op = plan(bn_key(op_tag::bn_train, dm, d.eps), 4.0 * 12 * x.numel(), [&](planned_op& p) {
    const dnnl::memory::desc md(dm, dt::f32, tag::nchw), cd({c}, dt::f32, tag::x);
    const auto pd =
        bn_forward_pd(dnnl::prop_kind::forward_training, md, d.eps, flags::use_scale | flags::use_shift, eng_);
    p.input(DNNL_ARG_SRC, md, pd.src_desc());
    p.input(DNNL_ARG_SCALE, cd, cd);
    p.input(DNNL_ARG_SHIFT, cd, cd);
    p.output(DNNL_ARG_DST, md, pd.dst_desc());
    p.output(DNNL_ARG_MEAN, cd, pd.mean_desc());
    p.output(DNNL_ARG_VARIANCE, cd, pd.variance_desc());
    p.scratchpad(pd.scratchpad_desc());
    p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::batch_normalization_forward(pd)));
  });
  float* var = scratch_floats(static_cast<std::size_t>(c), 0);
  run(op, {{DNNL_ARG_SRC, x.host_data()},
           {DNNL_ARG_SCALE, gamma.host_data()},
           {DNNL_ARG_SHIFT, beta.host_data()},
           {DNNL_ARG_DST, y.host_data()},
           {DNNL_ARG_MEAN, save_mean.host_data()},
           {DNNL_ARG_VARIANCE, var}});
  const float* mean = save_mean.f32();
  float *invstd = save_invstd.f32(), *rm = running_mean.f32(), *rv = running_var.f32();
  const double m = d.momentum;
  const double unbias = count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
  for (std::int64_t ch = 0; ch < c; ++ch) {
    invstd[ch] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(var[ch]) + d.eps));
    rm[ch] = static_cast<float>((1.0 - m) * rm[ch] + m * mean[ch]);
    rv[ch] = static_cast<float>((1.0 - m) * rv[ch] + m * var[ch] * unbias);
  }
}

void onednn_backend::batchnorm_forward_infer(const core::batchnorm_desc& d, const tensor& x, const tensor& gamma,
                                             const tensor& beta, const tensor& running_mean, const tensor& running_var,
                                             const tensor& y) {
  core::expect_f32(*this, x, "batchnorm_forward_infer: x");
  core::expect_f32(*this, y, "batchnorm_forward_infer: y");
  const auto dm = bn_dims(x);
  const std::int64_t c = dm[1];
  CLEAVE_ASSERT(y.numel() == x.numel(), "batchnorm_forward_infer: y must match x");
  check_channel(*this, gamma, c, "batchnorm_forward_infer: gamma");
  check_channel(*this, beta, c, "batchnorm_forward_infer: beta");
  check_channel(*this, running_mean, c, "batchnorm_forward_infer: running_mean");
  check_channel(*this, running_var, c, "batchnorm_forward_infer: running_var");
  if (x.numel() == 0) return;
  if (const int lx = image_layout_of(x); lx != 0) {
    claim(y);
    bn_infer_blocked(d, layout_block(lx), dm, x, gamma, beta, running_mean, running_var, y);
    return wrote(y, lx);
  }
  claim(y);
  const std::int64_t n = dm[0], hw = dm[2] * dm[3];
  if (hw >= k_min_plane) {
    const float *px = x.f32(), *pg = gamma.f32(), *pb = beta.f32(), *prm = running_mean.f32(), *prv = running_var.f32();
    float* py = y.f32();
#pragma omp parallel for num_threads(threads_for(4.0 * 8 * x.numel())) schedule(static)
    for (std::int64_t ch = 0; ch < c; ++ch) {
      const double invstd = 1.0 / std::sqrt(static_cast<double>(prv[ch]) + d.eps);
      const float scale = static_cast<float>(pg[ch] * invstd);
      const float shift = static_cast<float>(pb[ch] - prm[ch] * pg[ch] * invstd);
      for (std::int64_t i = 0; i < n; ++i) {
        const float* xp = px + (i * c + ch) * hw;
        float* yp = py + (i * c + ch) * hw;
#pragma omp simd
        for (std::int64_t j = 0; j < hw; ++j) yp[j] = xp[j] * scale + shift;
      }
    }
    return;
  }
  auto& op = plan(bn_key(op_tag::bn_infer, dm, d.eps), 4.0 * 8 * x.numel(), [&](planned_op& p) {
    const dnnl::memory::desc md(dm, dt::f32, tag::nchw), cd({c}, dt::f32, tag::x);
    const auto pd = bn_forward_pd(dnnl::prop_kind::forward_inference, md, d.eps,
                                  flags::use_global_stats | flags::use_scale | flags::use_shift, eng_);
    p.input(DNNL_ARG_SRC, md, pd.src_desc());
    p.input(DNNL_ARG_MEAN, cd, pd.mean_desc());
    p.input(DNNL_ARG_VARIANCE, cd, pd.variance_desc());
    p.input(DNNL_ARG_SCALE, cd, cd);
    p.input(DNNL_ARG_SHIFT, cd, cd);
    p.output(DNNL_ARG_DST, md, pd.dst_desc());
    p.scratchpad(pd.scratchpad_desc());
    p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::batch_normalization_forward(pd)));
  });
  run(op, {{DNNL_ARG_SRC, x.host_data()},
           {DNNL_ARG_MEAN, running_mean.host_data()},
           {DNNL_ARG_VARIANCE, running_var.host_data()},
           {DNNL_ARG_SCALE, gamma.host_data()},
           {DNNL_ARG_SHIFT, beta.host_data()},
           {DNNL_ARG_DST, y.host_data()}});
}

void onednn_backend::batchnorm_backward(const core::batchnorm_desc& d, const tensor& x, const tensor& dy,
                                        const tensor& gamma, const tensor& save_mean, const tensor& save_invstd,
                                        const tensor& dx, const tensor& dgamma, const tensor& dbeta) {
  core::expect_f32(*this, x, "batchnorm_backward: x");
  core::expect_f32(*this, dy, "batchnorm_backward: dy");
  core::expect_f32(*this, dx, "batchnorm_backward: dx");
  const auto dm = bn_dims(x);
  const std::int64_t c = dm[1], count = dm[0] * dm[2] * dm[3];
  CLEAVE_ASSERT(dy.numel() == x.numel() && dx.numel() == x.numel(), "batchnorm_backward: dy and dx must match x");
  check_channel(*this, gamma, c, "batchnorm_backward: gamma");
  check_channel(*this, save_mean, c, "batchnorm_backward: save_mean");
  check_channel(*this, save_invstd, c, "batchnorm_backward: save_invstd");
  check_channel(*this, dgamma, c, "batchnorm_backward: dgamma");
  check_channel(*this, dbeta, c, "batchnorm_backward: dbeta");
  if (count > 0 && c > 0) {
    const int lx = image_layout_of(x);
    if (lx != 0 && image_layout_of(dy) == lx) {
      claim(dx);
      bn_backward_blocked(layout_block(lx), dm, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
      return wrote(dx, lx);
    }
  }
  row_major({&x, &dy});
  claim(dx);
  if (count == 0 || c == 0)
    return reference_backend::batchnorm_backward(d, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
  const std::int64_t n = dm[0], hw = dm[2] * dm[3];
  if (hw >= k_min_plane) {
    const float *px = x.f32(), *pdy = dy.f32(), *pg = gamma.f32(), *pm = save_mean.f32(), *pi = save_invstd.f32();
    float *pdx = dx.f32(), *pdg = dgamma.f32(), *pdb = dbeta.f32();
    const double cnt = static_cast<double>(count);
#pragma omp parallel for num_threads(threads_for(4.0 * 16 * x.numel())) schedule(static)
    for (std::int64_t ch = 0; ch < c; ++ch) {
      const float mean = pm[ch], invstd = pi[ch];
      // sum dy and sum dy * (x - mean), per plane in float, across planes in double.
      double sum_dy = 0.0, sum_dy_xc = 0.0;
      for (std::int64_t i = 0; i < n; ++i) {
        const float *xp = px + (i * c + ch) * hw, *gp = pdy + (i * c + ch) * hw;
        float s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+ : s1, s2)
        for (std::int64_t j = 0; j < hw; ++j) {
          s1 += gp[j];
          s2 += gp[j] * (xp[j] - mean);
        }
        sum_dy += s1;
        sum_dy_xc += s2;
      }
      const double sum_dy_xhat = sum_dy_xc * invstd;
      // dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)), xhat = (x - mean) * invstd
      const float a = static_cast<float>(pg[ch] * invstd);
      const float mdy = static_cast<float>(sum_dy / cnt);
      const float k = static_cast<float>(sum_dy_xhat / cnt * invstd);  // times (x - mean)
      for (std::int64_t i = 0; i < n; ++i) {
        const float *xp = px + (i * c + ch) * hw, *gp = pdy + (i * c + ch) * hw;
        float* op = pdx + (i * c + ch) * hw;
#pragma omp simd
        for (std::int64_t j = 0; j < hw; ++j) op[j] = a * (gp[j] - mdy - (xp[j] - mean) * k);
      }
      pdg[ch] += static_cast<float>(sum_dy_xhat);
      pdb[ch] += static_cast<float>(sum_dy);
    }
    return;
  }
  auto& op = plan(bn_key(op_tag::bn_bwd, dm, d.eps), 4.0 * 16 * x.numel(), [&](planned_op& p) {
    const dnnl::memory::desc md(dm, dt::f32, tag::nchw), cd({c}, dt::f32, tag::x);
    const auto f = flags::use_scale | flags::use_shift;
    const auto hint = bn_forward_pd(dnnl::prop_kind::forward_training, md, d.eps, f, eng_);
    const auto pd = CLEAVE_CHECK_DNNL(dnnl::batch_normalization_backward::primitive_desc(
        {dnnl::prop_kind::backward, md, md, d.eps, f}, arena_scratchpad(), eng_, hint));
    p.input(DNNL_ARG_SRC, md, pd.src_desc());
    p.input(DNNL_ARG_DIFF_DST, md, pd.diff_dst_desc());
    p.input(DNNL_ARG_MEAN, cd, pd.mean_desc());
    p.input(DNNL_ARG_VARIANCE, cd, pd.variance_desc());
    p.input(DNNL_ARG_SCALE, cd, cd);
    // oneDNN 2.6 checks that a shift is given although backward does not read it.
    p.input(DNNL_ARG_SHIFT, cd, cd);
    p.output(DNNL_ARG_DIFF_SRC, md, pd.diff_src_desc());
    // oneDNN overwrites the parameter gradients; the interface accumulates them.
    p.output(DNNL_ARG_DIFF_SCALE, cd, cd, true);
    p.output(DNNL_ARG_DIFF_SHIFT, cd, cd, true);
    p.scratchpad(pd.scratchpad_desc());
    p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::batch_normalization_backward(pd)));
  });
  // The interface keeps 1/sqrt(var + eps); oneDNN wants var back.
  float* var = scratch_floats(static_cast<std::size_t>(c), 0);
  const float* invstd = save_invstd.f32();
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const double is = invstd[ch];
    var[ch] = static_cast<float>(1.0 / (is * is) - d.eps);
  }
  float* unused_shift = scratch_floats(static_cast<std::size_t>(c), 1);
  run(op, {{DNNL_ARG_SRC, x.host_data()},
           {DNNL_ARG_DIFF_DST, dy.host_data()},
           {DNNL_ARG_MEAN, save_mean.host_data()},
           {DNNL_ARG_VARIANCE, var},
           {DNNL_ARG_SCALE, gamma.host_data()},
           {DNNL_ARG_SHIFT, unused_shift},
           {DNNL_ARG_DIFF_SRC, dx.host_data()},
           {DNNL_ARG_DIFF_SCALE, dgamma.host_data()},
           {DNNL_ARG_DIFF_SHIFT, dbeta.host_data()}});
}

// ---- images in a blocked layout (nChw16c, nChw8c: channels in blocks of B, each pixel's B
// channels adjacent) ----------------------------------------------------------------------------
//
// The same arithmetic as the plane loops above: per image and channel a float sum over the
// pixels, across images in double (in image order, whatever the thread count); B channels at
// once in the vector lanes. Statistics are formed per (channel block, image) in parallel into
// scratch, then reduced per channel.

namespace {

struct blocked_dims {
  std::int64_t n, cb, hw;  // images, channel blocks, pixels per plane
};

// out[(b * n + i) * B + l] = sum over the pixels of image i, channel b * B + l, of f(x, dy).
template <int B, class F>
void blocked_partials(const blocked_dims& g, const float* px, const float* pdy, float* out, int threads, F&& f) {
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static)
  for (std::int64_t b = 0; b < g.cb; ++b)
    for (std::int64_t i = 0; i < g.n; ++i) {
      const std::int64_t base = (i * g.cb + b) * g.hw * B;
      float acc[B] = {};
      for (std::int64_t j = 0; j < g.hw; ++j) {
        const float* xp = px + base + j * B;
        const float* gp = pdy ? pdy + base + j * B : nullptr;
#pragma omp simd
        for (int l = 0; l < B; ++l) acc[l] += f(xp[l], gp ? gp[l] : 0.0f, static_cast<int>(b * B + l));
      }
      for (int l = 0; l < B; ++l) out[(b * g.n + i) * B + l] = acc[l];
    }
}

// Sum over images, in double, of the partials of channel ch.
template <int B>
double over_images(const blocked_dims& g, const float* part, std::int64_t ch) {
  const std::int64_t b = ch / B, l = ch % B;
  double s = 0.0;
  for (std::int64_t i = 0; i < g.n; ++i) s += part[(b * g.n + i) * B + l];
  return s;
}

// y = x * scale[ch] + shift[ch] over every element.
template <int B>
void blocked_affine(const blocked_dims& g, const float* px, float* py, const float* scale, const float* shift,
                    int threads) {
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static)
  for (std::int64_t b = 0; b < g.cb; ++b)
    for (std::int64_t i = 0; i < g.n; ++i) {
      const std::int64_t base = (i * g.cb + b) * g.hw * B;
      const float* sc = scale + b * B;
      const float* sh = shift + b * B;
      for (std::int64_t j = 0; j < g.hw; ++j) {
#pragma omp simd
        for (int l = 0; l < B; ++l) py[base + j * B + l] = px[base + j * B + l] * sc[l] + sh[l];
      }
    }
}

template <int B>
void train_blocked(const core::batchnorm_desc& d, const blocked_dims& g, std::int64_t c, const float* px,
                   const float* pg, const float* pb, float* py, float* pm, float* pi, float* prm, float* prv,
                   float* part, float* scale, float* shift, int threads) {
  const double cnt = static_cast<double>(g.n * g.hw), mom = d.momentum;
  blocked_partials<B>(g, px, nullptr, part, threads, [](float x, float, int) { return x; });
  for (std::int64_t ch = 0; ch < c; ++ch) pm[ch] = static_cast<float>(over_images<B>(g, part, ch) / cnt);
  const float* mean = pm;
  blocked_partials<B>(g, px, nullptr, part, threads, [mean](float x, float, int ch) {
    const float dv = x - mean[ch];
    return dv * dv;
  });
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const double m = pm[ch];
    const double var = over_images<B>(g, part, ch) / cnt, invstd = 1.0 / std::sqrt(var + d.eps);
    pi[ch] = static_cast<float>(invstd);
    scale[ch] = static_cast<float>(pg[ch] * invstd);
    shift[ch] = static_cast<float>(pb[ch] - m * pg[ch] * invstd);
    const double unbiased = cnt > 1 ? var * cnt / (cnt - 1) : var;
    prm[ch] = static_cast<float>((1.0 - mom) * prm[ch] + mom * m);
    prv[ch] = static_cast<float>((1.0 - mom) * prv[ch] + mom * unbiased);
  }
  blocked_affine<B>(g, px, py, scale, shift, threads);
}

template <int B>
void backward_blocked(const blocked_dims& g, std::int64_t c, const float* px, const float* pdy, const float* pg,
                      const float* pm, const float* pi, float* pdx, float* pdg, float* pdb, float* part_dy,
                      float* part_xc, float* a, float* mdy, float* k, int threads) {
  const double cnt = static_cast<double>(g.n * g.hw);
  blocked_partials<B>(g, px, pdy, part_dy, threads, [](float, float dy, int) { return dy; });
  blocked_partials<B>(g, px, pdy, part_xc, threads, [pm](float x, float dy, int ch) { return dy * (x - pm[ch]); });
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const double sum_dy = over_images<B>(g, part_dy, ch);
    const double sum_dy_xhat = over_images<B>(g, part_xc, ch) * pi[ch];
    a[ch] = static_cast<float>(pg[ch] * pi[ch]);
    mdy[ch] = static_cast<float>(sum_dy / cnt);
    k[ch] = static_cast<float>(sum_dy_xhat / cnt * pi[ch]);
    pdg[ch] += static_cast<float>(sum_dy_xhat);
    pdb[ch] += static_cast<float>(sum_dy);
  }
  // dx = a * (dy - mean(dy) - (x - mean) * k), as the plane loops.
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static)
  for (std::int64_t b = 0; b < g.cb; ++b)
    for (std::int64_t i = 0; i < g.n; ++i) {
      const std::int64_t base = (i * g.cb + b) * g.hw * B;
      const float *ab = a + b * B, *mb = mdy + b * B, *kb = k + b * B, *mean = pm + b * B;
      for (std::int64_t j = 0; j < g.hw; ++j) {
        const std::int64_t o = base + j * B;
#pragma omp simd
        for (int l = 0; l < B; ++l) pdx[o + l] = ab[l] * (pdy[o + l] - mb[l] - (px[o + l] - mean[l]) * kb[l]);
      }
    }
}

}  // namespace

void onednn_backend::bn_train_blocked(const core::batchnorm_desc& d, int block, const dnnl::memory::dims& dm,
                                      const tensor& x, const tensor& gamma, const tensor& beta, const tensor& y,
                                      const tensor& save_mean, const tensor& save_invstd, const tensor& running_mean,
                                      const tensor& running_var) {
  const std::int64_t c = dm[1];
  const blocked_dims g{dm[0], c / block, dm[2] * dm[3]};
  float* part = scratch_floats(static_cast<std::size_t>(dm[0] * c + 2 * c), 0);
  const int threads = threads_for(4.0 * 16 * x.numel());
  auto train = block == 16 ? train_blocked<16> : train_blocked<8>;
  train(d, g, c, x.f32(), gamma.f32(), beta.f32(), y.f32(), save_mean.f32(), save_invstd.f32(), running_mean.f32(),
        running_var.f32(), part, part + dm[0] * c, part + dm[0] * c + c, threads);
}

void onednn_backend::bn_infer_blocked(const core::batchnorm_desc& d, int block, const dnnl::memory::dims& dm,
                                      const tensor& x, const tensor& gamma, const tensor& beta,
                                      const tensor& running_mean, const tensor& running_var, const tensor& y) {
  const std::int64_t c = dm[1];
  const blocked_dims g{dm[0], c / block, dm[2] * dm[3]};
  float* scale = scratch_floats(static_cast<std::size_t>(2 * c), 0);
  float* shift = scale + c;
  const float *pg = gamma.f32(), *pb = beta.f32(), *prm = running_mean.f32(), *prv = running_var.f32();
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const double invstd = 1.0 / std::sqrt(static_cast<double>(prv[ch]) + d.eps);
    scale[ch] = static_cast<float>(pg[ch] * invstd);
    shift[ch] = static_cast<float>(pb[ch] - prm[ch] * pg[ch] * invstd);
  }
  const int threads = threads_for(4.0 * 8 * x.numel());
  if (block == 16)
    blocked_affine<16>(g, x.f32(), y.f32(), scale, shift, threads);
  else
    blocked_affine<8>(g, x.f32(), y.f32(), scale, shift, threads);
}

void onednn_backend::bn_backward_blocked(int block, const dnnl::memory::dims& dm, const tensor& x, const tensor& dy,
                                         const tensor& gamma, const tensor& save_mean, const tensor& save_invstd,
                                         const tensor& dx, const tensor& dgamma, const tensor& dbeta) {
  const std::int64_t c = dm[1];
  const blocked_dims g{dm[0], c / block, dm[2] * dm[3]};
  float* part = scratch_floats(static_cast<std::size_t>(2 * dm[0] * c + 3 * c), 0);
  float *part_xc = part + dm[0] * c, *a = part_xc + dm[0] * c, *mdy = a + c, *k = mdy + c;
  const int threads = threads_for(4.0 * 16 * x.numel());
  auto bwd = block == 16 ? backward_blocked<16> : backward_blocked<8>;
  bwd(g, c, x.f32(), dy.f32(), gamma.f32(), save_mean.f32(), save_invstd.f32(), dx.f32(), dgamma.f32(), dbeta.f32(),
      part, part_xc, a, mdy, k, threads);
}

}  // namespace cleave::backend::detail
