// oneDNN backend: pooling. The common 2x2 window with stride 2 and no padding runs on loops over
// NCHW planes (split across threads), about 2x faster than oneDNN's primitive, whose kernels
// transpose NCHW internally (bench/onednn); every other window runs on the primitive. The
// choice depends only on the window, so a backward always finds the workspace encoding its
// forward wrote: i32 argmax offsets for the loops, oneDNN's bytes for the primitive.
#include <omp.h>

#include <algorithm>

#include "dnnl_check.h"
#include "onednn_backend.h"

namespace cleave::backend::detail {

using core::tensor;
using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

namespace {

void check_pool(const core::pool2d_desc& d, const core::shape& xs, const core::shape& ys) {
  CLEAVE_ASSERT(xs.rank() == 4 && ys.rank() == 4 && xs[0] == ys[0] && xs[1] == ys[1], "pool2d shapes");
  CLEAVE_ASSERT(
      d.kernel_h >= 1 && d.kernel_w >= 1 && d.stride_h >= 1 && d.stride_w >= 1 && d.pad_h >= 0 && d.pad_w >= 0,
      "pool2d window");
  CLEAVE_ASSERT(ys[2] == core::window_out(xs[2], d.kernel_h, d.stride_h, d.pad_h) &&
                    ys[3] == core::window_out(xs[3], d.kernel_w, d.stride_w, d.pad_w),
                "pool2d output size mismatch");
}

// Work of a pooling pass over x and y, in flop-equivalents (4 x bytes).
double pool_work(const core::shape& xs, const core::shape& ys) {
  return 4.0 * 4 * static_cast<double>(xs.numel() + ys.numel());
}

// ---- loops for the 2x2 window, stride 2, no padding ------------------------------------------------

bool is_2x2_stride_2(const core::pool2d_desc& d) {
  return d.kernel_h == 2 && d.kernel_w == 2 && d.stride_h == 2 && d.stride_w == 2 && d.pad_h == 0 && d.pad_w == 0;
}

// One plane: x (H,W) -> y (P,Q), idx (P,Q) the argmax as an offset in the plane (or null).
// Ties keep the first element in row-major window order. Written as selects over row pairs so
// the compiler vectorises it.
void max_2x2_plane(const float* __restrict x, float* __restrict y, std::int32_t* __restrict idx, std::int64_t w,
                   std::int64_t ph, std::int64_t pw) {
  for (std::int64_t p = 0; p < ph; ++p) {
    const float* r0 = x + 2 * p * w;
    const float* r1 = r0 + w;
    float* yr = y + p * pw;
    const auto o0 = static_cast<std::int32_t>(2 * p * w), o1 = static_cast<std::int32_t>(2 * p * w + w);
    if (!idx) {
      for (std::int64_t q = 0; q < pw; ++q) {
        const float a = std::max(r0[2 * q], r0[2 * q + 1]), b = std::max(r1[2 * q], r1[2 * q + 1]);
        yr[q] = std::max(a, b);
      }
      continue;
    }
    std::int32_t* ir = idx + p * pw;
    for (std::int64_t q = 0; q < pw; ++q) {
      const auto c = static_cast<std::int32_t>(2 * q);
      float m = r0[2 * q];
      std::int32_t at = o0 + c;
      bool gt = r0[2 * q + 1] > m;
      m = gt ? r0[2 * q + 1] : m;
      at = gt ? o0 + c + 1 : at;
      gt = r1[2 * q] > m;
      m = gt ? r1[2 * q] : m;
      at = gt ? o1 + c : at;
      gt = r1[2 * q + 1] > m;
      m = gt ? r1[2 * q + 1] : m;
      at = gt ? o1 + c + 1 : at;
      yr[q] = m;
      ir[q] = at;
    }
  }
}

void avg_2x2_plane(const float* __restrict x, float* __restrict y, std::int64_t w, std::int64_t ph, std::int64_t pw) {
  for (std::int64_t p = 0; p < ph; ++p) {
    const float* r0 = x + 2 * p * w;
    const float* r1 = r0 + w;
    for (std::int64_t q = 0; q < pw; ++q)
      y[p * pw + q] = (r0[2 * q] + r0[2 * q + 1] + r1[2 * q] + r1[2 * q + 1]) * 0.25f;
  }
}

// dx (H,W) = 0 except the window elements of each output: dy at the argmax (max) or dy / 4 (avg).
void backward_2x2_plane(const float* __restrict dy, const std::int32_t* __restrict idx, float* __restrict dx,
                        std::int64_t h, std::int64_t w, std::int64_t ph, std::int64_t pw) {
  std::fill_n(dx, h * w, 0.0f);
  if (idx) {
    for (std::int64_t j = 0; j < ph * pw; ++j) dx[idx[j]] = dy[j];  // windows do not overlap
    return;
  }
  for (std::int64_t p = 0; p < ph; ++p) {
    float* r0 = dx + 2 * p * w;
    float* r1 = r0 + w;
    for (std::int64_t q = 0; q < pw; ++q) {
      const float v = dy[p * pw + q] * 0.25f;
      r0[2 * q] = v;
      r0[2 * q + 1] = v;
      r1[2 * q] = v;
      r1[2 * q + 1] = v;
    }
  }
}

// ---- the oneDNN primitive ------------------------------------------------------------------------

struct pool_setup {
  dnnl::memory::desc x, y;
  dims strides, kernel, pad_l, pad_r;
  dnnl::algorithm alg;
};

tag block_tag(int block) {
  return block == 16 ? tag::nChw16c : tag::nChw8c;
}

// `layout`: NCHW, or a blocked layout (nChw16c, nChw8c) the images are kept in.
pool_setup pool_descs(const core::pool2d_desc& d, const core::shape& xs, const core::shape& ys, tag layout) {
  pool_setup s;
  s.x = {{xs[0], xs[1], xs[2], xs[3]}, dt::f32, layout};
  s.y = {{ys[0], ys[1], ys[2], ys[3]}, dt::f32, layout};
  s.strides = {d.stride_h, d.stride_w};
  s.kernel = {d.kernel_h, d.kernel_w};
  s.pad_l = {d.pad_h, d.pad_w};
  s.pad_r = s.pad_l;  // oneDNN's output size formula floors like window_out()
  // avg: divide by the whole window, padding included (PyTorch's count_include_pad default).
  s.alg = d.kind == core::pool_kind::max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_include_padding;
  return s;
}

op_key pool_key(op_tag t, const core::pool2d_desc& d, const core::shape& xs, const core::shape& ys) {
  op_key k = make_key(t);
  k << xs[0] << xs[1] << xs[2] << xs[3] << ys[2] << ys[3] << static_cast<std::int64_t>(d.kind)
    << std::int64_t{d.kernel_h} << std::int64_t{d.kernel_w} << std::int64_t{d.stride_h} << std::int64_t{d.stride_w}
    << std::int64_t{d.pad_h} << std::int64_t{d.pad_w};
  return k;
}

dnnl::pooling_forward::primitive_desc pool_forward_pd(const pool_setup& s, bool training, const dnnl::engine& eng) {
  return CLEAVE_CHECK_DNNL(dnnl::pooling_forward::primitive_desc(
      {training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference, s.alg, s.x, s.y, s.strides,
       s.kernel, s.pad_l, s.pad_r},
      arena_scratchpad(), eng));
}

}  // namespace

void onednn_backend::pool2d_forward(const core::pool2d_desc& d, const tensor& x, const tensor& y, tensor* ws) {
  core::expect_f32(*this, x, "pool2d_forward: x");
  core::expect_f32(*this, y, "pool2d_forward: y");
  check_pool(d, x.shape(), y.shape());
  // Images kept blocked run the primitive in that layout (the 2x2 loops want NCHW planes).
  const int lx = image_layout_of(x);
  claim(y);
  // Only max pooling in training keeps a workspace (the argmax); avg pooling needs none.
  const bool training = ws != nullptr && d.kind == core::pool_kind::max;
  if (ws) *ws = tensor();
  if (x.numel() == 0 || y.numel() == 0) return;

  if (lx == 0 && pooling_ == pool_impl::automatic && is_2x2_stride_2(d)) {
    const auto &xs = x.shape(), &ys = y.shape();
    const std::int64_t n_planes = xs[0] * xs[1], h = xs[2], w = xs[3], ph = ys[2], pw = ys[3];
    if (training) *ws = empty(ys, core::dtype::i32);
    const float* px = x.f32();
    float* py = y.f32();
    std::int32_t* idx = training ? ws->host<std::int32_t>() : nullptr;
    const bool is_max = d.kind == core::pool_kind::max;
#pragma omp parallel for num_threads(threads_for(pool_work(xs, ys))) schedule(static)
    for (std::int64_t i = 0; i < n_planes; ++i) {
      if (is_max)
        max_2x2_plane(px + i * h * w, py + i * ph * pw, idx ? idx + i * ph * pw : nullptr, w, ph, pw);
      else
        avg_2x2_plane(px + i * h * w, py + i * ph * pw, w, ph, pw);
    }
    return;
  }

  op_key key = pool_key(op_tag::pool_fwd, d, x.shape(), y.shape());
  key << std::int64_t{training} << std::int64_t{lx};
  auto& op = plan(key, pool_work(x.shape(), y.shape()), [&](planned_op& p) {
    const auto s = pool_descs(d, x.shape(), y.shape(), lx ? block_tag(layout_block(lx)) : tag::nchw);
    const auto pd = pool_forward_pd(s, training, eng_);
    p.input(DNNL_ARG_SRC, s.x, pd.src_desc());
    p.result_layout = lx ? keep_layout(s.y) : 0;
    p.output(DNNL_ARG_DST, p.result_layout ? pd.dst_desc() : pool_descs(d, x.shape(), y.shape(), tag::nchw).y,
             pd.dst_desc());
    if (training) p.output(DNNL_ARG_WORKSPACE, pd.workspace_desc(), pd.workspace_desc());
    p.scratchpad(pd.scratchpad_desc());
    p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::pooling_forward(pd)));
  });
  void* ws_data = nullptr;
  if (training) {
    // oneDNN's workspace as raw bytes (u8).
    *ws = empty({static_cast<std::int64_t>(op.bytes_of(DNNL_ARG_WORKSPACE))}, core::dtype::u8);
    ws_data = ws->host_data();
  }
  run(op, {{DNNL_ARG_SRC, x.host_data()}, {DNNL_ARG_DST, y.host_data()}, {DNNL_ARG_WORKSPACE, ws_data}});
  wrote(y, op.result_layout);
  // The workspace is in the layout the primitive ran in: noted so the backward runs in it too
  // (only pool2d_backward reads it).
  if (training && lx) wrote(*ws, lx);
}

void onednn_backend::pool2d_backward(const core::pool2d_desc& d, const tensor& x, const tensor& dy, const tensor& ws,
                                     const tensor& dx) {
  core::expect_f32(*this, dy, "pool2d_backward: dy");
  core::expect_f32(*this, dx, "pool2d_backward: dx");
  check_pool(d, dx.shape(), dy.shape());
  const bool is_max = d.kind == core::pool_kind::max;
  if (dx.numel() == 0) return;
  if (dy.numel() == 0) return fill(dx, 0.0f);
  // The layout the forward ran in: the workspace's (max), else dy's.
  const int ldy = image_layout_of(dy);
  int layout = is_max ? (ws.defined() && ws.owner() == this && ws.dtype() == core::dtype::u8 ? layout_of(ws) : 0) : ldy;
  if (layout != 0 && !describes_images(layout, dx)) layout = 0;
  claim(dx);  // x is read by neither path: the argmax is in the workspace
  static const char* const bad_ws =
      "max pool backward needs the workspace from this backend's pool2d_forward of the same shape";

  if (layout == 0 && pooling_ == pool_impl::automatic && is_2x2_stride_2(d)) {
    row_major({&dy});
    const auto &xs = dx.shape(), &ys = dy.shape();
    const std::int64_t n_planes = xs[0] * xs[1], h = xs[2], w = xs[3], ph = ys[2], pw = ys[3];
    if (is_max)
      CLEAVE_ASSERT(ws.defined() && ws.owner() == this && ws.dtype() == core::dtype::i32 && ws.numel() == dy.numel(),
                    bad_ws);
    const float* pdy = dy.f32();
    float* pdx = dx.f32();
    const std::int32_t* idx = is_max ? ws.host<std::int32_t>() : nullptr;
#pragma omp parallel for num_threads(threads_for(pool_work(xs, ys))) schedule(static)
    for (std::int64_t i = 0; i < n_planes; ++i)
      backward_2x2_plane(pdy + i * ph * pw, idx ? idx + i * ph * pw : nullptr, pdx + i * h * w, h, w, ph, pw);
    return;
  }

  const double work = pool_work(dx.shape(), dy.shape());
  // dy in its own layout (image_layout_of made it row-major otherwise), staged into the
  // primitive's when they differ.
  op_key key = pool_key(op_tag::pool_bwd, d, dx.shape(), dy.shape());
  key << std::int64_t{layout} << std::int64_t{ldy};
  auto& op = plan(key, work, [&](planned_op& p) {
    const auto s = pool_descs(d, dx.shape(), dy.shape(), layout ? block_tag(layout_block(layout)) : tag::nchw);
    const auto plain = pool_descs(d, dx.shape(), dy.shape(), tag::nchw);
    const auto hint = pool_forward_pd(s, true, eng_);
    const auto pd = CLEAVE_CHECK_DNNL(dnnl::pooling_backward::primitive_desc(
        {s.alg, s.x, s.y, s.strides, s.kernel, s.pad_l, s.pad_r}, arena_scratchpad(), eng_, hint));
    p.input(DNNL_ARG_DIFF_DST, ldy ? layout_md(ldy) : plain.y, pd.diff_dst_desc());
    if (is_max) p.input(DNNL_ARG_WORKSPACE, pd.workspace_desc(), pd.workspace_desc());
    p.result_layout = layout ? keep_layout(s.x) : 0;
    p.output(DNNL_ARG_DIFF_SRC, p.result_layout ? pd.diff_src_desc() : plain.x, pd.diff_src_desc());
    p.scratchpad(pd.scratchpad_desc());
    p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::pooling_backward(pd)));
  });
  void* ws_data = nullptr;
  if (is_max) {
    CLEAVE_ASSERT(ws.defined() && ws.owner() == this && ws.dtype() == core::dtype::u8 &&
                      ws.bytes() == op.bytes_of(DNNL_ARG_WORKSPACE),
                  bad_ws);
    ws_data = ws.host_data();
  }
  run(op, {{DNNL_ARG_DIFF_DST, dy.host_data()}, {DNNL_ARG_WORKSPACE, ws_data}, {DNNL_ARG_DIFF_SRC, dx.host_data()}});
  wrote(dx, op.result_layout);
}

}  // namespace cleave::backend::detail
