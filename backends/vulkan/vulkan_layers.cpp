// vulkan backend: pooling, batch normalisation, softmax cross-entropy and optimizer updates.
#include <algorithm>
#include <cmath>

#include "vulkan_backend.h"

namespace cleave::backend::vk {

using core::tensor;

namespace {

std::uint32_t u32(std::int64_t v) {
  CLEAVE_ASSERT(v >= 0 && v <= 0xffffffffLL, "size does not fit the 32-bit indexing of the vulkan shaders");
  return static_cast<std::uint32_t>(v);
}

std::uint32_t channel_groups(std::int64_t c) {
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>(c, 1, 65535));
}

// Push constants of pool_fwd.comp / pool_bwd.comp.
struct pool_push {
  std::uint32_t n_planes, h, w, p, q;
  std::uint32_t kh, kw, sh, sw, ph, pw;
  std::uint32_t is_max, has_ws;
  std::uint32_t off_x, off_y, off_ws, off_dx;
  float scale;
};

pool_push pool_params(const core::pool2d_desc& d, const core::shape& xs, const core::shape& ys) {
  CLEAVE_ASSERT(xs.rank() == 4 && ys.rank() == 4 && xs[0] == ys[0] && xs[1] == ys[1], "pool2d shapes");
  CLEAVE_ASSERT(d.kernel_h > 0 && d.kernel_w > 0 && d.stride_h > 0 && d.stride_w > 0 && d.pad_h >= 0 && d.pad_w >= 0,
                "pool2d window");
  CLEAVE_ASSERT(ys[2] == core::window_out(xs[2], d.kernel_h, d.stride_h, d.pad_h) &&
                    ys[3] == core::window_out(xs[3], d.kernel_w, d.stride_w, d.pad_w),
                "pool2d output size mismatch");
  pool_push pc{};
  pc.n_planes = u32(xs[0] * xs[1]);
  pc.h = u32(xs[2]);
  pc.w = u32(xs[3]);
  pc.p = u32(ys[2]);
  pc.q = u32(ys[3]);
  pc.kh = u32(d.kernel_h);
  pc.kw = u32(d.kernel_w);
  pc.sh = u32(d.stride_h);
  pc.sw = u32(d.stride_w);
  pc.ph = u32(d.pad_h);
  pc.pw = u32(d.pad_w);
  pc.is_max = d.kind == core::pool_kind::max ? 1 : 0;
  pc.scale = 1.0f / static_cast<float>(d.kernel_h * d.kernel_w);
  return pc;
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

void vulkan_backend::pool2d_forward(const core::pool2d_desc& d, const tensor& x, const tensor& y, tensor* ws) {
  core::expect_f32(*this, x, "pool2d_forward: x");
  core::expect_f32(*this, y, "pool2d_forward: y");
  pool_push pc = pool_params(d, x.shape(), y.shape());
  const bool is_max = d.kind == core::pool_kind::max;
  if (ws && is_max) *ws = empty(y.shape(), core::dtype::i32);  // argmax as an offset into the (H,W) plane
  if (y.numel() == 0) return;
  const bound bx = bind(x, false), by = bind(y, true);
  const bound bw = ws && is_max ? bind(*ws, true) : dummy();
  pc.has_ws = ws && is_max ? 1 : 0;
  pc.off_x = bx.word;
  pc.off_y = by.word;
  pc.off_ws = bw.word;
  run("pool_fwd", {bx, by, bw}, pc, groups_for(y.numel()));
}

void vulkan_backend::pool2d_backward(const core::pool2d_desc& d, const tensor& x, const tensor& dy, const tensor& ws,
                                     const tensor& dx) {
  core::expect_f32(*this, dy, "pool2d_backward: dy");
  core::expect_f32(*this, dx, "pool2d_backward: dx");
  pool_push pc = pool_params(d, dx.shape(), dy.shape());
  const bool is_max = d.kind == core::pool_kind::max;
  if (is_max) {
    CLEAVE_ASSERT(ws.defined() && ws.dtype() == core::dtype::i32 && ws.numel() == dy.numel(),
                  "max pool backward needs the forward workspace");
  }
  if (dx.numel() == 0) return;
  const bound bdy = dy.numel() ? bind(dy, false) : dummy();
  const bound bw = is_max && ws.numel() ? bind(ws, false) : dummy();
  const bound bdx = bind(dx, true);
  pc.off_y = bdy.word;
  pc.off_ws = bw.word;
  pc.off_dx = bdx.word;
  run("pool_bwd", {bdy, bw, bdx}, pc, groups_for(dx.numel()));
}

void vulkan_backend::batchnorm_forward_train(const core::batchnorm_desc& d, const tensor& x, const tensor& gamma,
                                             const tensor& beta, const tensor& y, const tensor& save_mean,
                                             const tensor& save_invstd, const tensor& running_mean,
                                             const tensor& running_var) {
  const auto [n, c, hw] = split_nc(x);
  for (const auto* t : {&x, &gamma, &beta, &y, &save_mean, &save_invstd, &running_mean, &running_var})
    core::expect_f32(*this, *t, "batchnorm_forward_train: operand");
  CLEAVE_ASSERT(y.numel() == x.numel() && gamma.numel() == c && beta.numel() == c && save_mean.numel() == c &&
                    save_invstd.numel() == c && running_mean.numel() == c && running_var.numel() == c,
                "batchnorm_forward_train shapes");
  if (c == 0 || n * hw == 0) return;
  const bound bx = bind(x, false), bg = bind(gamma, false), bb = bind(beta, false), by = bind(y, true),
              bsm = bind(save_mean, true), bsi = bind(save_invstd, true), brm = bind(running_mean, true),
              brv = bind(running_var, true);
  struct {
    std::uint32_t n, c, hw;
    std::uint32_t off_x, off_g, off_b, off_y, off_sm, off_si, off_rm, off_rv;
    float eps, momentum;
  } pc{u32(n),   u32(c),   u32(hw),  bx.word,  bg.word, bb.word,   by.word,
       bsm.word, bsi.word, brm.word, brv.word, d.eps,   d.momentum};
  run("bn_train", {bx, bg, bb, by, bsm, bsi, brm, brv}, pc, channel_groups(c));
}

void vulkan_backend::batchnorm_forward_infer(const core::batchnorm_desc& d, const tensor& x, const tensor& gamma,
                                             const tensor& beta, const tensor& running_mean, const tensor& running_var,
                                             const tensor& y) {
  const auto [n, c, hw] = split_nc(x);
  for (const auto* t : {&x, &gamma, &beta, &running_mean, &running_var, &y})
    core::expect_f32(*this, *t, "batchnorm_forward_infer: operand");
  CLEAVE_ASSERT(y.numel() == x.numel() && gamma.numel() == c && beta.numel() == c && running_mean.numel() == c &&
                    running_var.numel() == c,
                "batchnorm_forward_infer shapes");
  if (x.numel() == 0) return;
  const bound bx = bind(x, false), bg = bind(gamma, false), bb = bind(beta, false), brm = bind(running_mean, false),
              brv = bind(running_var, false), by = bind(y, true);
  struct {
    std::uint32_t total, c, hw;
    std::uint32_t off_x, off_g, off_b, off_rm, off_rv, off_y;
    float eps;
  } pc{u32(x.numel()), u32(c), u32(hw), bx.word, bg.word, bb.word, brm.word, brv.word, by.word, d.eps};
  run("bn_infer", {bx, bg, bb, brm, brv, by}, pc, groups_for(x.numel()));
}

void vulkan_backend::batchnorm_backward(const core::batchnorm_desc&, const tensor& x, const tensor& dy,
                                        const tensor& gamma, const tensor& save_mean, const tensor& save_invstd,
                                        const tensor& dx, const tensor& dgamma, const tensor& dbeta) {
  const auto [n, c, hw] = split_nc(x);
  for (const auto* t : {&x, &dy, &gamma, &save_mean, &save_invstd, &dx, &dgamma, &dbeta})
    core::expect_f32(*this, *t, "batchnorm_backward: operand");
  CLEAVE_ASSERT(dy.numel() == x.numel() && dx.numel() == x.numel() && gamma.numel() == c && save_mean.numel() == c &&
                    save_invstd.numel() == c && dgamma.numel() == c && dbeta.numel() == c,
                "batchnorm_backward shapes");
  if (c == 0 || n * hw == 0) return;
  const bound bx = bind(x, false), bdy = bind(dy, false), bg = bind(gamma, false), bsm = bind(save_mean, false),
              bsi = bind(save_invstd, false), bdx = bind(dx, true), bdg = bind(dgamma, true), bdb = bind(dbeta, true);
  struct {
    std::uint32_t n, c, hw;
    std::uint32_t off_x, off_dy, off_g, off_sm, off_si, off_dx, off_dg, off_db;
  } pc{u32(n), u32(c), u32(hw), bx.word, bdy.word, bg.word, bsm.word, bsi.word, bdx.word, bdg.word, bdb.word};
  run("bn_bwd", {bx, bdy, bg, bsm, bsi, bdx, bdg, bdb}, pc, channel_groups(c));
}

void vulkan_backend::softmax_xent_forward(const tensor& logits, const tensor& labels, const tensor& probs,
                                          const tensor& loss) {
  core::expect_f32(*this, logits, "softmax_xent_forward: logits");
  core::expect_f32(*this, probs, "softmax_xent_forward: probs");
  core::expect_f32(*this, loss, "softmax_xent_forward: loss");
  CLEAVE_ASSERT(logits.shape().rank() == 2, "softmax_xent: logits must be (N,K)");
  const std::int64_t n = logits.shape()[0], k = logits.shape()[1];
  CLEAVE_ASSERT(labels.defined() && labels.owner() == this && labels.dtype() == core::dtype::i32 && labels.numel() == n,
                "softmax_xent: labels must be (N) i32");
  CLEAVE_ASSERT(probs.numel() == n * k && loss.numel() == 1, "softmax_xent_forward shapes");
  const bound bl = bind(logits, false), blab = bind(labels, false), bp = bind(probs, true);
  tensor row_loss = empty({std::max<std::int64_t>(n, 1)});
  const bound brl = bind(row_loss, true);
  struct {
    std::uint32_t n, k, off_l, off_lab, off_p, off_rl;
  } pc{u32(n), u32(k), bl.word, blab.word, bp.word, brl.word};
  run("softmax_xent_fwd", {bl, blab, bp, brl}, pc, channel_groups(n));
  const bound bloss = bind(loss, true);
  struct {
    std::uint32_t n, off_in, off_out;
  } mc{u32(n), brl.word, bloss.word};
  run("mean_reduce", {bind(row_loss, false), bloss}, mc, 1);
}

void vulkan_backend::softmax_xent_backward(const tensor& probs, const tensor& labels, const tensor& dlogits,
                                           float scale) {
  core::expect_f32(*this, probs, "softmax_xent_backward: probs");
  core::expect_f32(*this, dlogits, "softmax_xent_backward: dlogits");
  CLEAVE_ASSERT(probs.shape().rank() == 2, "softmax_xent: probs must be (N,K)");
  const std::int64_t n = probs.shape()[0], k = probs.shape()[1];
  CLEAVE_ASSERT(labels.defined() && labels.owner() == this && labels.dtype() == core::dtype::i32 && labels.numel() == n,
                "softmax_xent: labels must be (N) i32");
  CLEAVE_ASSERT(dlogits.numel() == n * k, "softmax_xent_backward shapes");
  if (n * k == 0) return;
  const bound bp = bind(probs, false), blab = bind(labels, false), bd = bind(dlogits, true);
  struct {
    std::uint32_t n, k, off_p, off_lab, off_d;
    float s;
  } pc{u32(n), u32(k), bp.word, blab.word, bd.word, scale / static_cast<float>(n)};
  run("softmax_xent_bwd", {bp, blab, bd}, pc, groups_for(n * k));
}

void vulkan_backend::sgd_update(const core::sgd_desc& d, const tensor& param, const tensor& grad,
                                const tensor& momentum_buf) {
  core::expect_f32(*this, param, "sgd_update: param");
  core::expect_f32(*this, grad, "sgd_update: grad");
  CLEAVE_ASSERT(param.numel() == grad.numel(), "sgd_update: element counts differ");
  const bool has_momentum = d.momentum != 0.0f;
  if (has_momentum) {
    core::expect_f32(*this, momentum_buf, "sgd_update: momentum_buf");
    CLEAVE_ASSERT(momentum_buf.numel() == param.numel(), "sgd_update: momentum buffer size");
  }
  if (param.numel() == 0) return;
  const bound bp = bind(param, true), bg = bind(grad, false);
  const bound bm = has_momentum ? bind(momentum_buf, true) : dummy();
  struct {
    std::uint32_t n, off_p, off_g, off_m;
    float lr, momentum, weight_decay;
    std::uint32_t nesterov, has_momentum;
  } pc{u32(param.numel()),    bp.word, bg.word, bm.word, d.lr, d.momentum, d.weight_decay, d.nesterov ? 1u : 0u,
       has_momentum ? 1u : 0u};
  run("sgd", {bp, bg, bm}, pc, groups_for(param.numel()));
}

void vulkan_backend::adamw_update(const core::adamw_desc& d, const tensor& param, const tensor& grad, const tensor& m,
                                  const tensor& v) {
  for (const auto* t : {&param, &grad, &m, &v}) core::expect_f32(*this, *t, "adamw_update: operand");
  CLEAVE_ASSERT(grad.numel() == param.numel() && m.numel() == param.numel() && v.numel() == param.numel(),
                "adamw_update: element counts differ");
  if (param.numel() == 0) return;
  // Bias corrections in double, as the reference computes them.
  const double bc1 = 1.0 - std::pow(static_cast<double>(d.beta1), static_cast<double>(d.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(d.beta2), static_cast<double>(d.step));
  const bound bp = bind(param, true), bg = bind(grad, false), bm = bind(m, true), bv = bind(v, true);
  struct {
    std::uint32_t n, off_p, off_g, off_m, off_v;
    float decay, beta1, beta2, step_size, bc2_sqrt, eps;
  } pc{u32(param.numel()),
       bp.word,
       bg.word,
       bm.word,
       bv.word,
       1.0f - d.lr * d.weight_decay,
       d.beta1,
       d.beta2,
       static_cast<float>(d.lr / bc1),
       static_cast<float>(std::sqrt(bc2)),
       d.eps};
  run("adamw", {bp, bg, bm, bv}, pc, groups_for(param.numel()));
}

}  // namespace cleave::backend::vk
