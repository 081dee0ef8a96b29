// oneDNN backend: construction, registry entry points, ReLU, clamp and the dense ops (on matmul).
#include "onednn_backend.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <thread>

#include "dnnl_check.h"
#include "factory.h"

namespace cleave::backend::detail {

using core::tensor;
using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

namespace {

int hardware_threads() {
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

std::string isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse4.1";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "isa " + std::to_string(static_cast<int>(isa));
  }
}

std::string library_version() {
  const auto* v = dnnl::version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

dnnl::memory::desc strided(const dims& d, const dims& strides) {
  return {d, dt::f32, strides};
}
dnnl::memory::desc row_major_matrix(std::int64_t rows, std::int64_t cols) {
  return strided({rows, cols}, {cols, 1});
}
// A (rows, cols) matrix stored as the transpose of a row-major (cols, rows) one.
dnnl::memory::desc col_major(std::int64_t rows, std::int64_t cols) {
  return strided({rows, cols}, {1, rows});
}

void same_numel(const tensor& a, const tensor& b, const char* op) {
  CLEAVE_ASSERT(a.numel() == b.numel(),
                std::string(op) + ": element counts differ: " + a.shape().str() + " vs " + b.shape().str());
}

}  // namespace

onednn_backend::onednn_backend(onednn_options opt)
    : n_threads_(std::clamp(opt.n_threads, 1, hardware_threads())),
      layout_(opt.layout),
      pooling_(opt.pooling),
      conv_(opt.conv),
      min_parallel_work_(opt.min_parallel_work),
      keep_layouts_(opt.keep_layouts) {
  set_omp_threads(n_threads_);
  eng_ = CLEAVE_CHECK_DNNL(dnnl::engine(dnnl::engine::kind::cpu, 0));
  stream_ = CLEAVE_CHECK_DNNL(dnnl::stream(eng_));
}

onednn_backend::~onednn_backend() = default;

std::string onednn_backend::device_name() const {
  return "host CPU (oneDNN " + library_version() + ", " + isa_name(dnnl::get_effective_cpu_isa()) + ", " +
         std::to_string(n_threads_) + (n_threads_ == 1 ? " thread" : " threads") +
         (conv_ == conv_algorithm::direct ? ", portable kernels)" : ")");
}

std::size_t onednn_backend::n_cached_running(const std::string& impl) const {
  return static_cast<std::size_t>(std::count_if(
      cache_.begin(), cache_.end(), [&](const auto& kv) { return kv.second->impl().find(impl) != std::string::npos; }));
}

void onednn_backend::run(planned_op& op, std::initializer_list<binding> args) {
  op.run(stream_, arena_, args);
}

float* onednn_backend::scratch_floats(std::size_t n, int which) {
  auto& v = floats_[which];
  if (v.size() < n) v.resize(n);
  return v.data();
}

void onednn_backend::synchronize() {
  CLEAVE_CHECK_DNNL(stream_.wait());
}

// ---- ReLU and clamp (eltwise over the flat element range) ------------------------------------

void onednn_backend::eltwise_forward(const char* what, bool relu, float lo, float hi, const tensor& x,
                                     const tensor& y) {
  core::expect_f32(*this, x, what);
  core::expect_f32(*this, y, what);
  same_numel(x, y, what);
  const std::int64_t n = x.numel();
  if (n == 0) return;
  // Over the flat element range: y in x's layout.
  const int lx = layout_of(x);
  claim(y);
  op_key key = make_key(relu ? op_tag::relu_fwd : op_tag::clamp_fwd) << n;
  if (!relu) key << std::int64_t{std::bit_cast<std::uint32_t>(lo)} << std::int64_t{std::bit_cast<std::uint32_t>(hi)};
  auto& op = plan(key, 4.0 * 8 * n, [&](planned_op& p) {
    const dnnl::memory::desc md({n}, dt::f32, tag::x);
    const auto alg = relu ? dnnl::algorithm::eltwise_relu : dnnl::algorithm::eltwise_clip_v2;
    auto pd = CLEAVE_CHECK_DNNL(dnnl::eltwise_forward::primitive_desc(
        {dnnl::prop_kind::forward_training, alg, md, relu ? 0.0f : lo, relu ? 0.0f : hi}, eng_));
    p.input(DNNL_ARG_SRC, md, pd.src_desc());
    p.output(DNNL_ARG_DST, md, pd.dst_desc());
    p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::eltwise_forward(pd)));
  });
  run(op, {{DNNL_ARG_SRC, x.host_data()}, {DNNL_ARG_DST, y.host_data()}});
  wrote(y, lx);
}

void onednn_backend::eltwise_backward(const char* what, bool relu, float lo, float hi, const tensor& y,
                                      const tensor& dy, const tensor& dx) {
  core::expect_f32(*this, y, what);
  core::expect_f32(*this, dy, what);
  core::expect_f32(*this, dx, what);
  same_numel(y, dy, what);
  same_numel(dy, dx, what);
  const std::int64_t n = y.numel();
  if (n == 0) return;
  // Over the flat element range: y and dy in one layout, dx in it too.
  const int layout = shared_layout(y, dy);
  claim(dx);
  op_key key = make_key(relu ? op_tag::relu_bwd : op_tag::clamp_bwd) << n;
  if (!relu) key << std::int64_t{std::bit_cast<std::uint32_t>(lo)} << std::int64_t{std::bit_cast<std::uint32_t>(hi)};
  auto& op = plan(key, 4.0 * 12 * n, [&](planned_op& p) {
    const dnnl::memory::desc md({n}, dt::f32, tag::x);
    // The gradient reads the forward output (the interface passes y, not x): relu's dx = y > 0 ?
    // dy : 0, clip_v2's dx = lo < y < hi ? dy : 0.
    const auto alg =
        relu ? dnnl::algorithm::eltwise_relu_use_dst_for_bwd : dnnl::algorithm::eltwise_clip_v2_use_dst_for_bwd;
    const float a = relu ? 0.0f : lo, b = relu ? 0.0f : hi;
    auto hint = CLEAVE_CHECK_DNNL(
        dnnl::eltwise_forward::primitive_desc({dnnl::prop_kind::forward_training, alg, md, a, b}, eng_));
    auto pd = CLEAVE_CHECK_DNNL(dnnl::eltwise_backward::primitive_desc({alg, md, md, a, b}, eng_, hint));
    p.input(DNNL_ARG_DST, md, md);
    p.input(DNNL_ARG_DIFF_DST, md, pd.diff_dst_desc());
    p.output(DNNL_ARG_DIFF_SRC, md, pd.diff_src_desc());
    p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::eltwise_backward(pd)));
  });
  run(op, {{DNNL_ARG_DST, y.host_data()}, {DNNL_ARG_DIFF_DST, dy.host_data()}, {DNNL_ARG_DIFF_SRC, dx.host_data()}});
  wrote(dx, layout);
}

void onednn_backend::relu_forward(const tensor& x, const tensor& y) {
  eltwise_forward("relu_forward", true, 0.0f, 0.0f, x, y);
}

void onednn_backend::relu_backward(const tensor& y, const tensor& dy, const tensor& dx) {
  eltwise_backward("relu_backward", true, 0.0f, 0.0f, y, dy, dx);
}

void onednn_backend::clamp_forward(const tensor& x, const tensor& y, float lo, float hi) {
  CLEAVE_ASSERT(lo < hi, "clamp_forward: lo must be below hi");
  eltwise_forward("clamp_forward", false, lo, hi, x, y);
}

void onednn_backend::clamp_backward(const tensor& y, const tensor& dy, const tensor& dx, float lo, float hi) {
  eltwise_backward("clamp_backward", false, lo, hi, y, dy, dx);
}

// ---- dense: everything on the matmul primitive (brgemm kernels on AVX-512) -------------------

void onednn_backend::matmul(const tensor& a, const tensor& b, const tensor& c, bool trans_a, bool trans_b, float alpha,
                            float beta) {
  core::expect_f32(*this, a, "matmul: a");
  core::expect_f32(*this, b, "matmul: b");
  core::expect_f32(*this, c, "matmul: c");
  row_major({&a, &b, &c});
  CLEAVE_ASSERT(a.shape().rank() == 2 && b.shape().rank() == 2 && c.shape().rank() == 2, "matmul needs 2-D tensors");
  const std::int64_t m = c.shape()[0], n = c.shape()[1];
  const std::int64_t k = trans_a ? a.shape()[0] : a.shape()[1];
  CLEAVE_ASSERT((trans_a ? a.shape()[1] : a.shape()[0]) == m, "matmul: a rows");
  CLEAVE_ASSERT((trans_b ? b.shape()[1] : b.shape()[0]) == k && (trans_b ? b.shape()[0] : b.shape()[1]) == n,
                "matmul: b shape");
  if (m == 0 || n == 0 || k == 0) return reference_backend::matmul(a, b, c, trans_a, trans_b, alpha, beta);
  const bool scaled = alpha != 1.0f;
  op_key key = make_key(op_tag::matmul);
  key << m << n << k << std::int64_t{trans_a} << std::int64_t{trans_b} << std::int64_t{scaled} << beta;
  auto& op = plan(key, 2.0 * m * n * k, [&](planned_op& p) {
    const auto a_md = trans_a ? col_major(m, k) : row_major_matrix(m, k);
    const auto b_md = trans_b ? col_major(k, n) : row_major_matrix(k, n);
    const auto c_md = row_major_matrix(m, n);
    dnnl::primitive_attr attr;
    if (scaled) attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
    if (beta != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(beta);
      attr.set_post_ops(po);
    }
    auto pd = CLEAVE_CHECK_DNNL(dnnl::matmul::primitive_desc({a_md, b_md, c_md}, arena_scratchpad(attr), eng_));
    p.scratchpad(pd.scratchpad_desc());
    p.input(DNNL_ARG_SRC, a_md, pd.src_desc());
    p.input(DNNL_ARG_WEIGHTS, b_md, pd.weights_desc());
    if (scaled) {
      const dnnl::memory::desc s_md({1}, dt::f32, tag::x);
      p.input(DNNL_ARG_ATTR_OUTPUT_SCALES, s_md, s_md);
    }
    p.output(DNNL_ARG_DST, c_md, pd.dst_desc());
    p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::matmul(pd)));
  });
  alpha_ = alpha;
  run(op, {{DNNL_ARG_SRC, a.host_data()},
           {DNNL_ARG_WEIGHTS, b.host_data()},
           {DNNL_ARG_ATTR_OUTPUT_SCALES, scaled ? &alpha_ : nullptr},
           {DNNL_ARG_DST, c.host_data()}});
}

void onednn_backend::linear_forward(const tensor& x, const tensor& w, const tensor& b, const tensor& y) {
  core::expect_f32(*this, x, "linear_forward: x");
  core::expect_f32(*this, w, "linear_forward: w");
  core::expect_f32(*this, y, "linear_forward: y");
  if (b.defined()) core::expect_f32(*this, b, "linear_forward: b");
  row_major({&x, &w, &b, &y});
  CLEAVE_ASSERT(w.shape().rank() == 2 && x.shape().rank() >= 1, "linear_forward: w must be (O,I)");
  const std::int64_t n = x.shape()[0], in = w.shape()[1], out = w.shape()[0];
  CLEAVE_ASSERT(x.numel() == n * in && y.numel() == n * out && (!b.defined() || b.numel() == out),
                "linear_forward shapes");
  if (n == 0 || in == 0 || out == 0) return reference_backend::linear_forward(x, w, b, y);
  const bool bias = b.defined();
  auto& op = plan(
      make_key(op_tag::linear_fwd) << n << in << out << std::int64_t{bias}, 2.0 * n * in * out, [&](planned_op& p) {
        const auto x_md = row_major_matrix(n, in), w_md = col_major(in, out), y_md = row_major_matrix(n, out);
        const auto b_md = bias ? row_major_matrix(1, out) : dnnl::memory::desc();
        auto pd = CLEAVE_CHECK_DNNL(dnnl::matmul::primitive_desc({x_md, w_md, b_md, y_md}, arena_scratchpad(), eng_));
        p.scratchpad(pd.scratchpad_desc());
        p.input(DNNL_ARG_SRC, x_md, pd.src_desc());
        p.input(DNNL_ARG_WEIGHTS, w_md, pd.weights_desc());
        if (bias) p.input(DNNL_ARG_BIAS, b_md, pd.bias_desc());
        p.output(DNNL_ARG_DST, y_md, pd.dst_desc());
        p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::matmul(pd)));
      });
  run(op, {{DNNL_ARG_SRC, x.host_data()},
           {DNNL_ARG_WEIGHTS, w.host_data()},
           {DNNL_ARG_BIAS, bias ? b.host_data() : nullptr},
           {DNNL_ARG_DST, y.host_data()}});
}

void onednn_backend::linear_backward_data(const tensor& dy, const tensor& w, const tensor& dx) {
  core::expect_f32(*this, dy, "linear_backward_data: dy");
  core::expect_f32(*this, w, "linear_backward_data: w");
  core::expect_f32(*this, dx, "linear_backward_data: dx");
  row_major({&dy, &w, &dx});
  CLEAVE_ASSERT(w.shape().rank() == 2 && dy.shape().rank() >= 1, "linear_backward_data: w must be (O,I)");
  const std::int64_t n = dy.shape()[0], in = w.shape()[1], out = w.shape()[0];
  CLEAVE_ASSERT(dy.numel() == n * out && dx.numel() == n * in, "linear_backward_data shapes");
  if (n == 0 || in == 0 || out == 0) return reference_backend::linear_backward_data(dy, w, dx);
  auto& op = plan(make_key(op_tag::linear_bwd_data) << n << in << out, 2.0 * n * in * out, [&](planned_op& p) {
    const auto dy_md = row_major_matrix(n, out), w_md = row_major_matrix(out, in), dx_md = row_major_matrix(n, in);
    auto pd = CLEAVE_CHECK_DNNL(dnnl::matmul::primitive_desc({dy_md, w_md, dx_md}, arena_scratchpad(), eng_));
    p.scratchpad(pd.scratchpad_desc());
    p.input(DNNL_ARG_SRC, dy_md, pd.src_desc());
    p.input(DNNL_ARG_WEIGHTS, w_md, pd.weights_desc());
    p.output(DNNL_ARG_DST, dx_md, pd.dst_desc());
    p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::matmul(pd)));
  });
  run(op, {{DNNL_ARG_SRC, dy.host_data()}, {DNNL_ARG_WEIGHTS, w.host_data()}, {DNNL_ARG_DST, dx.host_data()}});
}

void onednn_backend::linear_backward_weights(const tensor& x, const tensor& dy, const tensor& dw, const tensor& db) {
  core::expect_f32(*this, x, "linear_backward_weights: x");
  core::expect_f32(*this, dy, "linear_backward_weights: dy");
  core::expect_f32(*this, dw, "linear_backward_weights: dw");
  if (db.defined()) core::expect_f32(*this, db, "linear_backward_weights: db");
  row_major({&x, &dy, &dw, &db});
  CLEAVE_ASSERT(dw.shape().rank() == 2 && dy.shape().rank() >= 1, "linear_backward_weights: dw must be (O,I)");
  const std::int64_t n = dy.shape()[0], in = dw.shape()[1], out = dw.shape()[0];
  CLEAVE_ASSERT(dy.numel() == n * out && x.numel() == n * in && (!db.defined() || db.numel() == out),
                "linear_backward_weights shapes");
  if (n == 0 || in == 0 || out == 0) return reference_backend::linear_backward_weights(x, dy, dw, db);
  // dw += dy^T x: the sum post-op makes the primitive accumulate into dw.
  auto& op = plan(make_key(op_tag::linear_bwd_weights) << n << in << out, 2.0 * n * in * out, [&](planned_op& p) {
    const auto dyt_md = col_major(out, n), x_md = row_major_matrix(n, in), dw_md = row_major_matrix(out, in);
    dnnl::post_ops po;
    po.append_sum(1.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    auto pd = CLEAVE_CHECK_DNNL(dnnl::matmul::primitive_desc({dyt_md, x_md, dw_md}, arena_scratchpad(attr), eng_));
    p.scratchpad(pd.scratchpad_desc());
    p.input(DNNL_ARG_SRC, dyt_md, pd.src_desc());
    p.input(DNNL_ARG_WEIGHTS, x_md, pd.weights_desc());
    p.output(DNNL_ARG_DST, dw_md, pd.dst_desc());
    p.set_primitive(CLEAVE_CHECK_DNNL(dnnl::matmul(pd)));
  });
  run(op, {{DNNL_ARG_SRC, dy.host_data()}, {DNNL_ARG_WEIGHTS, x.host_data()}, {DNNL_ARG_DST, dw.host_data()}});
  if (db.defined()) {
    // Column sums of dy, formed apart and then added, so db gets one rounding like dw.
    float* sums = scratch_floats(static_cast<std::size_t>(out), 0);
    std::fill_n(sums, out, 0.0f);
    const float* pdy = dy.f32();
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t o = 0; o < out; ++o) sums[o] += pdy[i * out + o];
    float* pdb = db.f32();
    for (std::int64_t o = 0; o < out; ++o) pdb[o] += sums[o];
  }
}

// ---- registry -------------------------------------------------------------------------------

backend_info probe_onednn() {
  try {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    return {"onednn", true,
            "host CPU (oneDNN " + library_version() + ", " + isa_name(dnnl::get_effective_cpu_isa()) + ")", false};
  } catch (const dnnl::error& e) {
    return {"onednn", false, std::string("oneDNN CPU engine unavailable: ") + e.what(), false};
  }
}

std::unique_ptr<core::backend> create_onednn(const std::string& device) {
  // "onednn[:<threads>][,<flag>...]" (or "onednn:<flag>"). portable: only the kernels a CPU
  // without AVX-512 has too (direct convolutions: no Winograd, no few-channel loops), as an
  // emulated arm64 board should run. row-major: every activation back in row-major order after
  // each op (onednn_options::keep_layouts off), for measurements.
  onednn_options opt;
  std::string threads;
  std::size_t pos = 0;
  for (bool first = true; pos <= device.size(); first = false) {
    const std::size_t comma = std::min(device.find(',', pos), device.size());
    const std::string part = device.substr(pos, comma - pos);
    pos = comma + 1;
    if (part == "portable") {
      opt.conv = conv_algorithm::direct;
    } else if (part == "row-major") {
      opt.keep_layouts = false;
    } else if (first) {
      threads = part;
    } else {
      throw core::error(
          "backend 'onednn' takes a thread count and the flags 'portable' and 'row-major', e.g. "
          "'onednn:2,portable' (got ':" +
          device + "')");
    }
  }
  if (!threads.empty()) {
    std::size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(threads, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != threads.size() || n < 1)
      throw core::error("backend 'onednn' takes an optional thread count, e.g. 'onednn:2' (got ':" + device + "')");
    opt.n_threads = n;
  }
  return std::make_unique<onednn_backend>(opt);
}

}  // namespace cleave::backend::detail
