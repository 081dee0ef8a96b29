// oneDNN backend: convolution (forward, backward data, backward weights).
#include "dnnl_check.h"
#include "onednn_backend.h"

namespace cleave::backend::detail {

using core::tensor;
using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

namespace {

using core::conv_dims;

bool empty_conv(const conv_dims& c) {
  return c.n * c.c * c.h * c.w * c.k * c.r * c.s * c.p * c.q == 0;
}

double conv_flops(const conv_dims& c) {
  return 2.0 * c.n * c.k * c.p * c.q * c.cg() * c.r * c.s;
}

// The activation layout per op, measured on oneDNN 2.6.3 with AVX-512 (bench/onednn): the
// blocked kernels win when C is a multiple of 16; for other C >= 4 channels-last kernels win
// (oneDNN's own choice there is an AVX2 kernel, 2-3x slower in backward); with C < 4 (a
// first layer) the blocked forward and backward-weights kernels keep the input NCHW, while
// backward data is 3x faster channels-last.
tag activation_tag(conv_layout policy, conv_op op, std::int64_t c) {
  switch (policy) {
    case conv_layout::blocked:
      return tag::any;
    case conv_layout::nhwc:
      return tag::nhwc;
    case conv_layout::nchw:
      return tag::nchw;
    case conv_layout::automatic:
      break;
  }
  if (c % 16 == 0) return tag::any;
  if (c < 4) return op == conv_op::backward_data ? tag::nhwc : tag::any;
  if (c < 16 && op == conv_op::forward) return tag::any;
  return tag::nhwc;
}

struct conv_mds {
  dnnl::memory::desc x, w, b, y;      // as the primitive should choose them
  dnnl::memory::desc ux, uw, ub, uy;  // the caller's: NCHW, KCRS, (K)
  dims strides, pad_l, pad_r;
};

conv_mds conv_descs(const core::conv2d_desc& d, const conv_dims& c, tag act, bool bias) {
  conv_mds m;
  // Grouped weights are (G, K/G, C/G, R, S) to oneDNN: the same bytes as the caller's (K, C/G, R, S).
  const bool grouped = c.g > 1;
  const dims xd{c.n, c.c, c.h, c.w}, yd{c.n, c.k, c.p, c.q};
  const dims wd = grouped ? dims{c.g, c.kg(), c.cg(), c.r, c.s} : dims{c.k, c.c, c.r, c.s};
  const tag plain_w = grouped ? tag::goihw : tag::oihw;
  m.ux = {xd, dt::f32, tag::nchw};
  m.uw = {wd, dt::f32, plain_w};
  m.uy = {yd, dt::f32, tag::nchw};
  m.ub = bias ? dnnl::memory::desc({c.k}, dt::f32, tag::x) : dnnl::memory::desc();
  m.x = {xd, dt::f32, act};
  m.y = {yd, dt::f32, act};
  m.w = {wd, dt::f32, act == tag::nchw ? plain_w : tag::any};
  m.b = m.ub;
  m.strides = {d.stride_h, d.stride_w};
  m.pad_l = {d.pad_h, d.pad_w};
  // Symmetric padding: oneDNN's output size formula floors like window_out().
  m.pad_r = m.pad_l;
  return m;
}

// Whether a convolution's activation output may stay in the primitive's blocked layout. Not for
// grouped (depthwise) convolutions: in MobileNet-style blocks the convolutions next to them are
// pointwise, which run on row-major tensors (onednn_pointwise.cpp), so a kept output is reordered
// there (in place, one copy more) instead of here. Measured on MobileNetV2 (batch 64, 2 threads):
// 225 img/s keeping them, 255 reordering at once.
bool keeps_output(const conv_dims& c) {
  return c.g == 1;
}

// Winograd F(4x4, 3x3) where oneDNN 2.6 has it and it wins, measured with AVX-512 at batch 64
// on 2 threads (forward, backward data, backward weights; direct -> winograd, ms): ResNet-18's
// 64 channels at 28x28 15.9/16.1/16.2 -> 6.6/6.1/8.0, 512 at 4x4 16.1/14.9/22.0 ->
// 7.9/8.6/9.2, ResNet-8's 16 at 28x28 1.01/1.01/1.10 -> 0.80/0.81/1.07. Its tiles are 4x4
// outputs: at 3x3 and 2x2 outputs the forward takes 1.2-2.2x longer than direct, so those stay
// direct. Blocked layouts only (channel counts in 16s), 3x3, stride 1, one group. The result
// differs from direct by rounding (~2e-6 relative).
bool winograd_shape(conv_algorithm algo, conv_layout layout, const core::conv2d_desc& d, const conv_dims& c) {
  return algo == conv_algorithm::automatic && (layout == conv_layout::automatic || layout == conv_layout::blocked) &&
         c.g == 1 && c.r == 3 && c.s == 3 && d.stride_h == 1 && d.stride_w == 1 && c.c % 16 == 0 && c.k % 16 == 0 &&
         c.p >= 4 && c.q >= 4;
}

dnnl::convolution_forward::primitive_desc conv_forward_pd(const conv_mds& m, dnnl::algorithm alg,
                                                          const dnnl::engine& eng) {
  return dnnl::convolution_forward::primitive_desc(
      {dnnl::prop_kind::forward_training, alg, m.x, m.w, m.b, m.y, m.strides, m.pad_l, m.pad_r}, arena_scratchpad(),
      eng);
}

// `make(algorithm)`'s primitive descriptor: winograd where winograd_shape() says so and this
// CPU has a kernel for it, else direct (oneDNN has no winograd without AVX-512, e.g. on arm64).
template <class Make>
auto conv_pd(bool winograd, Make&& make) {
  if (winograd) {
    try {
      return make(dnnl::algorithm::convolution_winograd);
    } catch (const dnnl::error&) {
    }
  }
  return CLEAVE_CHECK_DNNL(make(dnnl::algorithm::convolution_direct));
}

}  // namespace

void onednn_backend::conv2d_forward(const core::conv2d_desc& d, const tensor& x, const tensor& w, const tensor& b,
                                    const tensor& y) {
  core::expect_f32(*this, x, "conv2d_forward: x");
  core::expect_f32(*this, w, "conv2d_forward: w");
  core::expect_f32(*this, y, "conv2d_forward: y");
  if (b.defined()) core::expect_f32(*this, b, "conv2d_forward: b");
  const auto c = core::conv_dims_of(d, x, w, y);
  CLEAVE_ASSERT(!b.defined() || b.numel() == c.k, "conv2d_forward: bias must be (K)");
  if (empty_conv(c) || pointwise(d, c) || narrow(conv_op::forward, d, c)) {  // on row-major tensors
    row_major({&x, &w, &b});
    claim(y);
    if (empty_conv(c)) return reference_backend::conv2d_forward(d, x, w, b, y);
    if (pointwise(d, c)) return pointwise_forward(c, x.f32(), w.f32(), b.defined() ? b.f32() : nullptr, y.f32());
    return narrow_forward(d, c, x.f32(), w.f32(), b.defined() ? b.f32() : nullptr, y.f32());
  }
  const int lx = image_layout_of(x);
  const bool bias = b.defined();
  op_key key = make_key(op_tag::conv_fwd);
  key << c.n << c.c << c.h << c.w << c.k << c.r << c.s << std::int64_t{d.stride_h} << std::int64_t{d.stride_w}
      << std::int64_t{d.pad_h} << std::int64_t{d.pad_w} << c.g << std::int64_t{bias} << std::int64_t{lx};
  auto& op = plan(key, conv_flops(c), [&](planned_op& p) {
    const auto m = conv_descs(d, c, activation_tag(layout_, conv_op::forward, c.c), bias);
    const auto pd = conv_pd(winograd_shape(conv_, layout_, d, c),
                            [&](dnnl::algorithm alg) { return conv_forward_pd(m, alg, eng_); });
    p.input(DNNL_ARG_SRC, lx ? layout_md(lx) : m.ux, pd.src_desc());
    p.input(DNNL_ARG_WEIGHTS, m.uw, pd.weights_desc());
    if (bias) p.input(DNNL_ARG_BIAS, m.ub, pd.bias_desc());
    p.result_layout = keeps_output(c) ? keep_layout(pd.dst_desc()) : 0;
    p.output(DNNL_ARG_DST, p.result_layout ? pd.dst_desc() : m.uy, pd.dst_desc());
    p.scratchpad(pd.scratchpad_desc());
    p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::convolution_forward(pd)));
  });
  row_major({&w, &b});
  claim(y);
  run(op, {{DNNL_ARG_SRC, x.host_data()},
           {DNNL_ARG_WEIGHTS, w.host_data()},
           {DNNL_ARG_BIAS, bias ? b.host_data() : nullptr},
           {DNNL_ARG_DST, y.host_data()}});
  wrote(y, op.result_layout);
}

void onednn_backend::conv2d_backward_data(const core::conv2d_desc& d, const tensor& dy, const tensor& w,
                                          const tensor& dx) {
  core::expect_f32(*this, dy, "conv2d_backward_data: dy");
  core::expect_f32(*this, w, "conv2d_backward_data: w");
  core::expect_f32(*this, dx, "conv2d_backward_data: dx");
  const auto c = core::conv_dims_of(d, dx, w, dy);
  if (empty_conv(c) || pointwise(d, c) || narrow(conv_op::backward_data, d, c)) {  // on row-major tensors
    row_major({&dy, &w});
    claim(dx);
    if (empty_conv(c)) return reference_backend::conv2d_backward_data(d, dy, w, dx);
    if (pointwise(d, c)) return pointwise_backward_data(c, dy.f32(), w.f32(), dx.f32());
    return narrow_backward_data(d, c, dy.f32(), w.f32(), dx.f32());
  }
  const int ldy = image_layout_of(dy);
  op_key key = make_key(op_tag::conv_bwd_data);
  key << c.n << c.c << c.h << c.w << c.k << c.r << c.s << std::int64_t{d.stride_h} << std::int64_t{d.stride_w}
      << std::int64_t{d.pad_h} << std::int64_t{d.pad_w} << c.g << std::int64_t{ldy};
  auto& op = plan(key, conv_flops(c), [&](planned_op& p) {
    const auto m = conv_descs(d, c, activation_tag(layout_, conv_op::backward_data, c.c), false);
    const auto pd = conv_pd(winograd_shape(conv_, layout_, d, c), [&](dnnl::algorithm alg) {
      return dnnl::convolution_backward_data::primitive_desc({alg, m.x, m.w, m.y, m.strides, m.pad_l, m.pad_r},
                                                             arena_scratchpad(), eng_, conv_forward_pd(m, alg, eng_));
    });
    p.input(DNNL_ARG_DIFF_DST, ldy ? layout_md(ldy) : m.uy, pd.diff_dst_desc());
    p.input(DNNL_ARG_WEIGHTS, m.uw, pd.weights_desc());
    p.result_layout = keeps_output(c) ? keep_layout(pd.diff_src_desc()) : 0;
    p.output(DNNL_ARG_DIFF_SRC, p.result_layout ? pd.diff_src_desc() : m.ux, pd.diff_src_desc());
    p.scratchpad(pd.scratchpad_desc());
    p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::convolution_backward_data(pd)));
  });
  row_major({&w});
  claim(dx);
  run(op,
      {{DNNL_ARG_DIFF_DST, dy.host_data()}, {DNNL_ARG_WEIGHTS, w.host_data()}, {DNNL_ARG_DIFF_SRC, dx.host_data()}});
  wrote(dx, op.result_layout);
}

void onednn_backend::conv2d_backward_weights(const core::conv2d_desc& d, const tensor& x, const tensor& dy,
                                             const tensor& dw, const tensor& db) {
  core::expect_f32(*this, x, "conv2d_backward_weights: x");
  core::expect_f32(*this, dy, "conv2d_backward_weights: dy");
  core::expect_f32(*this, dw, "conv2d_backward_weights: dw");
  if (db.defined()) core::expect_f32(*this, db, "conv2d_backward_weights: db");
  const auto c = core::conv_dims_of(d, x, dw, dy);
  CLEAVE_ASSERT(!db.defined() || db.numel() == c.k, "conv2d_backward_weights: db must be (K)");
  row_major({&dw, &db});
  if (empty_conv(c) || pointwise(d, c) || narrow(conv_op::backward_weights, d, c)) {  // on row-major tensors
    row_major({&x, &dy});
    if (empty_conv(c)) return reference_backend::conv2d_backward_weights(d, x, dy, dw, db);
    if (pointwise(d, c))
      return pointwise_backward_weights(c, x.f32(), dy.f32(), dw.f32(), db.defined() ? db.f32() : nullptr);
    return narrow_backward_weights(d, c, x.f32(), dy.f32(), dw.f32(), db.defined() ? db.f32() : nullptr);
  }
  const int lx = image_layout_of(x), ldy = image_layout_of(dy);
  const bool bias = db.defined();
  op_key key = make_key(op_tag::conv_bwd_weights);
  key << c.n << c.c << c.h << c.w << c.k << c.r << c.s << std::int64_t{d.stride_h} << std::int64_t{d.stride_w}
      << std::int64_t{d.pad_h} << std::int64_t{d.pad_w} << c.g << std::int64_t{bias} << std::int64_t{lx}
      << std::int64_t{ldy};
  auto& op = plan(key, conv_flops(c), [&](planned_op& p) {
    const auto m = conv_descs(d, c, activation_tag(layout_, conv_op::backward_weights, c.c), bias);
    const auto pd = conv_pd(winograd_shape(conv_, layout_, d, c), [&](dnnl::algorithm alg) {
      return dnnl::convolution_backward_weights::primitive_desc({alg, m.x, m.w, m.b, m.y, m.strides, m.pad_l, m.pad_r},
                                                                arena_scratchpad(), eng_,
                                                                conv_forward_pd(m, alg, eng_));
    });
    p.input(DNNL_ARG_SRC, lx ? layout_md(lx) : m.ux, pd.src_desc());
    p.input(DNNL_ARG_DIFF_DST, ldy ? layout_md(ldy) : m.uy, pd.diff_dst_desc());
    // The primitive overwrites its gradients; the interface accumulates (dw += ..., db += ...).
    p.output(DNNL_ARG_DIFF_WEIGHTS, m.uw, pd.diff_weights_desc(), true);
    if (bias) p.output(DNNL_ARG_DIFF_BIAS, m.ub, pd.diff_bias_desc(), true);
    p.scratchpad(pd.scratchpad_desc());
    p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::convolution_backward_weights(pd)));
  });
  run(op, {{DNNL_ARG_SRC, x.host_data()},
           {DNNL_ARG_DIFF_DST, dy.host_data()},
           {DNNL_ARG_DIFF_WEIGHTS, dw.host_data()},
           {DNNL_ARG_DIFF_BIAS, bias ? db.host_data() : nullptr}});
}

}  // namespace cleave::backend::detail
