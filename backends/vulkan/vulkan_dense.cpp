// vulkan backend: matmul, linear layers and convolutions, all on the tiled GEMM shaders
// (convolutions as implicit GEMM), with split-K where the output is too small to fill the device.
#include <algorithm>
#include <array>
#include <thread>

#include "vulkan_backend.h"

namespace cleave::backend::vk {

using core::tensor;

namespace {

std::uint32_t u32(std::int64_t v) {
  CLEAVE_ASSERT(v >= 0 && v <= 0xffffffffLL, "size does not fit the 32-bit indexing of the vulkan shaders");
  return static_cast<std::uint32_t>(v);
}

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return static_cast<std::uint32_t>((a + b - 1) / b);
}

struct tile_config {
  std::uint32_t bm, bn, tm, tn;
};

// Output tile per workgroup: skinny shapes (few output channels, small batch) get tiles that
// waste fewer invocations.
constexpr std::uint32_t k_tile = 16;  // BK of gemm_core.glsl

// Shared memory of gemm_core.glsl's padded A and B slices plus the convolution tables.
std::uint32_t shared_bytes(const tile_config& t) {
  return 4 * (k_tile * (t.bm + 1) + k_tile * (t.bn + 1) + 4 * t.bn + 4 * k_tile);
}

// Output tile per workgroup: skinny shapes (few output channels, small batch) get tiles that
// waste fewer invocations; tiles that need more shared memory than the device has fall back
// to 64 x 64 (which fits the 16 KiB every device offers).
tile_config pick_tile(std::uint32_t m, std::uint32_t n, std::uint32_t max_shared) {
  tile_config t{64, 64, 4, 4};
  if (m <= 16 && n <= 32)
    t = {16, 32, 1, 2};
  else if (m <= 8)
    t = {8, 256, 1, 8};
  else if (m <= 16)
    t = {16, 128, 1, 8};
  else if (n <= 16)
    t = {128, 16, 8, 1};
  else if (m <= 32)
    t = {32, 128, 2, 8};
  else if (n <= 32)
    t = {128, 32, 8, 2};
  else if (m >= 256 && n >= 256)
    t = {128, 128, 8, 8};
  if (shared_bytes(t) > max_shared) t = {64, 64, 4, 4};
  return t;
}

constexpr std::uint32_t min_k_per_split = 256;  // below this a split does too little to pay off

}  // namespace

// Push constants of the GEMM-shaped shaders (gemm_common.glsl), and the operand layouts.
struct vulkan_backend::gemm_args {
  struct push {
    std::uint32_t m = 0, n = 0, kd = 0;
    std::uint32_t off_a = 0, off_b = 0, off_c = 0, off_bias = 0;
    std::uint32_t k_per_split = 0, n_split = 1, tile_j0 = 0;
    float alpha = 1.0f, beta = 0.0f;
    std::uint32_t bias_mode = 0, c_rs = 0, c_grp = 1, c_gs = 0;
    std::array<std::uint32_t, 13> e{};
  } pc;
  bool a_p_fast = true, b_j_fast = true;
  // conv_bwd_data takes the strides as specialization constants 6 and 7.
  bool stride_spec = false;
};

void vulkan_backend::gemm(std::string_view shader, gemm_args& g, const bound& a, const bound& b, const bound& c,
                          const bound& bias) {
  auto& pc = g.pc;
  if (pc.m == 0 || pc.n == 0) return;
  // gemm and conv_bwd_weights write a plain row-major C; the others index C with a table.
  CLEAVE_ASSERT(shader == "conv_fwd" || shader == "conv_bwd_data" || (pc.c_grp == pc.n && pc.c_gs == 0),
                "gemm: plain output layout expected");
  pc.off_a = a.word;
  pc.off_b = b.word;
  pc.off_bias = bias.word;
  const tile_config t = pick_tile(pc.m, pc.n, dev_->limits().maxComputeSharedMemorySize);
  const std::uint32_t tiles_m = ceil_div(pc.m, t.bm), tiles_n = ceil_div(pc.n, t.bn);

  // Split-K when the output tiles alone cannot keep the device busy.
  const auto type = dev_->physical().type;
  const std::uint32_t target = type == VK_PHYSICAL_DEVICE_TYPE_CPU
                                   ? 2 * std::max(1u, std::thread::hardware_concurrency())
                                   : (type == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU ? 512u : 128u);
  std::uint32_t n_split = 1;
  const std::uint64_t tiles = std::uint64_t{tiles_m} * tiles_n;
  if (tiles < target && pc.kd >= 2 * min_k_per_split)
    n_split = std::min<std::uint32_t>({ceil_div(target, tiles), pc.kd / min_k_per_split, 64u});
  std::uint32_t kps = pc.kd;
  if (n_split > 1) {
    kps = ceil_div(ceil_div(pc.kd, n_split), k_tile) * k_tile;
    n_split = ceil_div(pc.kd, kps);
  }
  pc.k_per_split = kps;
  pc.n_split = n_split;

  const std::array<std::uint32_t, 8> spec_words{
      t.bm, t.bn, t.tm, t.tn, g.a_p_fast ? 1u : 0u, g.b_j_fast ? 1u : 0u, pc.e[9], pc.e[10]};
  const std::span<const std::uint32_t> spec(spec_words.data(), g.stride_spec ? 8 : 6);
  tensor part;
  bound out = c;
  if (n_split > 1) {
    part = empty({static_cast<std::int64_t>(n_split) * pc.m * pc.n}, core::dtype::f32);
    out = bind(part, true);
  }
  pc.off_c = out.word;
  // Workgroup counts are limited per dimension: walk the column tiles in chunks.
  std::uint32_t max_x = dev_->limits().maxComputeWorkGroupCount[0];
  if (max_groups_x_) max_x = std::min(max_x, max_groups_x_);
  CLEAVE_ASSERT(tiles_m <= dev_->limits().maxComputeWorkGroupCount[1], "gemm: too many row tiles for the device");
  for (std::uint32_t j0 = 0; j0 < tiles_n; j0 += max_x) {
    pc.tile_j0 = j0;
    run(shader, {a, b, out, bias}, pc, std::min(max_x, tiles_n - j0), tiles_m, n_split, spec);
  }
  if (n_split > 1) {
    auto rc = pc;
    rc.off_a = out.word;
    rc.off_c = c.word;
    const std::uint64_t mn = std::uint64_t{pc.m} * pc.n;
    run("splitk_reduce", {out, dummy(), c, bias}, rc, groups_for(static_cast<std::int64_t>(mn)));
  }
}

void vulkan_backend::matmul(const tensor& a, const tensor& b, const tensor& c, bool trans_a, bool trans_b, float alpha,
                            float beta) {
  CLEAVE_ASSERT(a.shape().rank() == 2 && b.shape().rank() == 2 && c.shape().rank() == 2, "matmul needs 2-D tensors");
  core::expect_f32(*this, a, "matmul: a");
  core::expect_f32(*this, b, "matmul: b");
  core::expect_f32(*this, c, "matmul: c");
  const std::int64_t m = c.shape()[0], n = c.shape()[1];
  const std::int64_t k = trans_a ? a.shape()[0] : a.shape()[1];
  CLEAVE_ASSERT((trans_a ? a.shape()[1] : a.shape()[0]) == m, "matmul: a rows");
  CLEAVE_ASSERT((trans_b ? b.shape()[1] : b.shape()[0]) == k && (trans_b ? b.shape()[0] : b.shape()[1]) == n,
                "matmul: b shape");
  if (m == 0 || n == 0) return;
  gemm_args g;
  g.pc.m = u32(m);
  g.pc.n = u32(n);
  g.pc.kd = u32(k);
  g.pc.alpha = alpha;
  g.pc.beta = beta;
  g.pc.c_rs = g.pc.c_grp = u32(n);
  g.pc.e = {trans_a ? 1u : u32(k), trans_a ? u32(m) : 1u, trans_b ? 1u : u32(n), trans_b ? u32(k) : 1u};
  g.a_p_fast = !trans_a;
  g.b_j_fast = !trans_b;
  gemm("gemm", g, k ? bind(a, false) : dummy(), k ? bind(b, false) : dummy(), bind(c, true), dummy());
}

void vulkan_backend::linear_forward(const tensor& x, const tensor& w, const tensor& b, const tensor& y) {
  core::expect_f32(*this, x, "linear_forward: x");
  core::expect_f32(*this, w, "linear_forward: w");
  core::expect_f32(*this, y, "linear_forward: y");
  const std::int64_t n = x.shape()[0], in = w.shape()[1], out = w.shape()[0];
  CLEAVE_ASSERT(x.numel() == n * in && y.numel() == n * out, "linear_forward shapes");
  if (b.defined()) {
    core::expect_f32(*this, b, "linear_forward: b");
    CLEAVE_ASSERT(b.numel() == out, "linear_forward: bias size");
  }
  gemm_args g;
  g.pc.m = u32(n);
  g.pc.n = u32(out);
  g.pc.kd = u32(in);
  g.pc.c_rs = g.pc.c_grp = u32(out);
  g.pc.bias_mode = b.defined() ? 2 : 0;
  g.pc.e = {u32(in), 1, 1, u32(in)};
  g.a_p_fast = true;
  g.b_j_fast = false;
  if (n == 0 || out == 0) return;
  gemm("gemm", g, in ? bind(x, false) : dummy(), in ? bind(w, false) : dummy(), bind(y, true), bind_opt(b, false));
}

void vulkan_backend::linear_backward_data(const tensor& dy, const tensor& w, const tensor& dx) {
  core::expect_f32(*this, dy, "linear_backward_data: dy");
  core::expect_f32(*this, w, "linear_backward_data: w");
  core::expect_f32(*this, dx, "linear_backward_data: dx");
  const std::int64_t n = dy.shape()[0], in = w.shape()[1], out = w.shape()[0];
  CLEAVE_ASSERT(dy.numel() == n * out && dx.numel() == n * in, "linear_backward_data shapes");
  if (n == 0 || in == 0) return;
  gemm_args g;
  g.pc.m = u32(n);
  g.pc.n = u32(in);
  g.pc.kd = u32(out);
  g.pc.c_rs = g.pc.c_grp = u32(in);
  g.pc.e = {u32(out), 1, u32(in), 1};
  gemm("gemm", g, out ? bind(dy, false) : dummy(), out ? bind(w, false) : dummy(), bind(dx, true), dummy());
}

void vulkan_backend::linear_backward_weights(const tensor& x, const tensor& dy, const tensor& dw, const tensor& db) {
  core::expect_f32(*this, x, "linear_backward_weights: x");
  core::expect_f32(*this, dy, "linear_backward_weights: dy");
  core::expect_f32(*this, dw, "linear_backward_weights: dw");
  const std::int64_t n = dy.shape()[0], in = dw.shape()[1], out = dw.shape()[0];
  CLEAVE_ASSERT(dy.numel() == n * out && x.numel() == n * in, "linear_backward_weights shapes");
  if (n == 0) return;  // += of an empty sum
  gemm_args g;
  g.pc.m = u32(out);
  g.pc.n = u32(in);
  g.pc.kd = u32(n);
  g.pc.beta = 1.0f;  // dw +=
  g.pc.c_rs = g.pc.c_grp = u32(in);
  g.pc.e = {1, u32(out), u32(in), 1};
  g.a_p_fast = false;
  g.b_j_fast = true;
  gemm("gemm", g, bind(dy, false), bind(x, false), bind(dw, true), dummy());
  if (db.defined()) {
    core::expect_f32(*this, db, "linear_backward_weights: db");
    CLEAVE_ASSERT(db.numel() == out, "linear_backward_weights: db size");
    const bound bdy = bind(dy, false), bdb = bind(db, true);
    struct {
      std::uint32_t outer, k, inner, off_dy, off_db;
    } pc{u32(n), u32(out), 1, bdy.word, bdb.word};
    run("bias_grad", {bdy, bdb}, pc, static_cast<std::uint32_t>(std::min<std::int64_t>(out, 65535)));
  }
}

namespace {

using core::conv_dims;

// Push constants of the direct grouped-convolution shaders (shaders/gconv_common.glsl).
struct gconv_push {
  std::uint32_t n, c, h, w, k, r, s, p, q;
  std::uint32_t sh, sw, ph, pw, g;
  std::uint32_t off0, off1, off2, off_b;
  std::uint32_t has_bias;
};

gconv_push gconv_params(const core::conv2d_desc& d, const conv_dims& c) {
  gconv_push pc{};
  pc.n = u32(c.n), pc.c = u32(c.c), pc.h = u32(c.h), pc.w = u32(c.w), pc.k = u32(c.k), pc.r = u32(c.r);
  pc.s = u32(c.s), pc.p = u32(c.p), pc.q = u32(c.q);
  pc.sh = u32(d.stride_h), pc.sw = u32(d.stride_w), pc.ph = u32(d.pad_h), pc.pw = u32(d.pad_w), pc.g = u32(c.g);
  return pc;
}

std::array<std::uint32_t, 13> conv_words(const core::conv2d_desc& d, const conv_dims& c) {
  return {u32(c.n), u32(c.c), u32(c.h),        u32(c.w),        u32(c.k),     u32(c.r),    u32(c.s),
          u32(c.p), u32(c.q), u32(d.stride_h), u32(d.stride_w), u32(d.pad_h), u32(d.pad_w)};
}

}  // namespace

void vulkan_backend::conv2d_forward(const core::conv2d_desc& d, const tensor& x, const tensor& w, const tensor& b,
                                    const tensor& y) {
  core::expect_f32(*this, x, "conv2d_forward: x");
  core::expect_f32(*this, w, "conv2d_forward: w");
  core::expect_f32(*this, y, "conv2d_forward: y");
  const auto c = core::conv_dims_of(d, x, w, y);
  if (b.defined()) {
    core::expect_f32(*this, b, "conv2d_forward: b");
    CLEAVE_ASSERT(b.numel() == c.k, "conv2d_forward: bias size");
  }
  if (y.numel() == 0) return;
  if (c.g > 1) {
    // Grouped and depthwise: a direct kernel (a GEMM per group would be a sliver for depthwise).
    gconv_push pc = gconv_params(d, c);
    const bound bx = bind(x, false), bw = bind(w, false), by = bind(y, true), bb = bind_opt(b, false);
    pc.off0 = bx.word, pc.off1 = bw.word, pc.off2 = by.word, pc.off_b = bb.word, pc.has_bias = b.defined();
    run("gconv_fwd", {bx, bw, by, bb}, pc, groups_for(y.numel()));
    return;
  }
  gemm_args g;
  g.pc.m = u32(c.k);
  g.pc.n = u32(c.n * c.p * c.q);
  g.pc.kd = u32(c.c * c.r * c.s);
  g.pc.c_rs = g.pc.c_grp = u32(c.p * c.q);
  g.pc.c_gs = u32(c.k * c.p * c.q);
  g.pc.bias_mode = b.defined() ? 1 : 0;
  g.pc.e = conv_words(d, c);
  g.a_p_fast = true;
  g.b_j_fast = true;
  const bool has_k = g.pc.kd > 0;
  gemm("conv_fwd", g, has_k ? bind(w, false) : dummy(), has_k ? bind(x, false) : dummy(), bind(y, true),
       bind_opt(b, false));
}

void vulkan_backend::conv2d_backward_data(const core::conv2d_desc& d, const tensor& dy, const tensor& w,
                                          const tensor& dx) {
  core::expect_f32(*this, dy, "conv2d_backward_data: dy");
  core::expect_f32(*this, w, "conv2d_backward_data: w");
  core::expect_f32(*this, dx, "conv2d_backward_data: dx");
  const auto c = core::conv_dims_of(d, dx, w, dy);
  if (dx.numel() == 0) return;
  if (c.g > 1) {
    gconv_push pc = gconv_params(d, c);
    if (dy.numel() == 0) return fill(dx, 0.0f);
    const bound bdy = bind(dy, false), bw = bind(w, false), bdx = bind(dx, true);
    pc.off0 = bdy.word, pc.off1 = bw.word, pc.off2 = bdx.word;
    run("gconv_bwd_data", {bdy, bw, bdx}, pc, groups_for(dx.numel()));
    return;
  }
  gemm_args g;
  g.pc.m = u32(c.c);
  g.pc.n = u32(c.n * c.h * c.w);
  g.pc.kd = u32(c.k * c.r * c.s);
  g.pc.c_rs = g.pc.c_grp = u32(c.h * c.w);
  g.pc.c_gs = u32(c.c * c.h * c.w);
  g.pc.e = conv_words(d, c);
  g.a_p_fast = true;
  g.b_j_fast = true;
  g.stride_spec = true;
  const bool has_k = g.pc.kd > 0 && dy.numel() > 0;
  gemm("conv_bwd_data", g, has_k ? bind(w, false) : dummy(), has_k ? bind(dy, false) : dummy(), bind(dx, true),
       dummy());
}

void vulkan_backend::conv2d_backward_weights(const core::conv2d_desc& d, const tensor& x, const tensor& dy,
                                             const tensor& dw, const tensor& db) {
  core::expect_f32(*this, x, "conv2d_backward_weights: x");
  core::expect_f32(*this, dy, "conv2d_backward_weights: dy");
  core::expect_f32(*this, dw, "conv2d_backward_weights: dw");
  const auto c = core::conv_dims_of(d, x, dw, dy);
  if (dy.numel() == 0) return;  // += of an empty sum
  if (c.g > 1 && dw.numel() > 0) {
    gconv_push pc = gconv_params(d, c);
    const bound bx = bind(x, false), bdy = bind(dy, false), bdw = bind(dw, true);
    pc.off0 = bx.word, pc.off1 = bdy.word, pc.off2 = bdw.word;
    run("gconv_bwd_weights", {bx, bdy, bdw}, pc, groups_for(dw.numel()));
  } else if (dw.numel() > 0) {
    gemm_args g;
    g.pc.m = u32(c.k);
    g.pc.n = u32(c.c * c.r * c.s);
    g.pc.kd = u32(c.n * c.p * c.q);
    g.pc.beta = 1.0f;  // dw +=
    g.pc.c_rs = g.pc.c_grp = g.pc.n;
    g.pc.e = conv_words(d, c);
    g.a_p_fast = true;
    g.b_j_fast = false;
    gemm("conv_bwd_weights", g, bind(dy, false), bind(x, false), bind(dw, true), dummy());
  }
  if (db.defined()) {
    core::expect_f32(*this, db, "conv2d_backward_weights: db");
    CLEAVE_ASSERT(db.numel() == c.k, "conv2d_backward_weights: db size");
    const bound bdy = bind(dy, false), bdb = bind(db, true);
    struct {
      std::uint32_t outer, k, inner, off_dy, off_db;
    } pc{u32(c.n), u32(c.k), u32(c.p * c.q), bdy.word, bdb.word};
    run("bias_grad", {bdy, bdb}, pc, static_cast<std::uint32_t>(std::min<std::int64_t>(c.k, 65535)));
  }
}

}  // namespace cleave::backend::vk
