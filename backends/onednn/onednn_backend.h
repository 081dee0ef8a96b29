// The oneDNN CPU backend: host memory and cheap element-wise ops from the reference backend,
// the heavy ops (conv, pooling, dense, batch norm, ReLU) on oneDNN primitives cached per shape.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "op_cache.h"
#include "reference_backend.h"

namespace cleave::backend::detail {

// Tags that open every op_key, one per kind of primitive.
enum class op_tag : std::int64_t {
  relu_fwd = 1,
  relu_bwd,
  matmul,
  linear_fwd,
  linear_bwd_data,
  linear_bwd_weights,
  conv_fwd,
  conv_bwd_data,
  conv_bwd_weights,
  pool_fwd,
  pool_bwd,
  bn_train,
  bn_infer,
  bn_bwd,
  clamp_fwd,
  clamp_bwd,
};

inline op_key make_key(op_tag t) {
  op_key k;
  k << static_cast<std::int64_t>(t);
  return k;
}

// Which activation layout a convolution primitive works in. The caller's tensors stay NCHW;
// any other layout costs a reorder in and out, repaid when the primitive is faster.
enum class conv_layout : std::uint8_t {
  automatic,  // per op and channel count, from measurements on oneDNN 2.6 / AVX-512
  blocked,    // oneDNN's choice ("any"), usually nChw16c
  nhwc,       // channels last
  nchw,       // the caller's layout: no reorders (oneDNN then uses im2col + GEMM)
};

// Which algorithm 3x3 convolutions use. Winograd F(4x4, 3x3) does about a quarter of the
// multiplications of the direct kernels; oneDNN 2.6 has it for f32 on AVX-512 in blocked
// layouts. `direct` always takes the direct kernels (for measurements).
enum class conv_algorithm : std::uint8_t { automatic, direct };

// The three passes of a convolution.
enum class conv_op : std::uint8_t { forward, backward_data, backward_weights };

// How pooling runs: loops for 2x2 windows of stride 2 and oneDNN's primitive for the rest, or
// the primitive for every window (for measurements).
enum class pool_impl : std::uint8_t { automatic, primitive };

struct onednn_options {
  int n_threads = 2;  // OpenMP threads for primitives (capped at the hardware's count)
  conv_layout layout = conv_layout::automatic;
  pool_impl pooling = pool_impl::automatic;
  conv_algorithm conv = conv_algorithm::automatic;
  // Activations a convolution writes in a blocked layout (nChw16c, nChw8c) stay in it through
  // the ops that run on it (batch norm, ReLU, clamp, add, the next convolution), reordered to
  // row-major only where an op or a reader needs that; false reorders every output back at once.
  bool keep_layouts = true;
  // Ops with less work than this (flops, or 4 x bytes moved for memory-bound ops) run on one
  // thread. A fork and join costs microseconds on idle cores, but a whole scheduler slice when
  // another process holds a core: on LeNet-5 only the convolutions split.
  double min_parallel_work = 1e7;
};

class onednn_backend final : public reference_backend {
 public:
  explicit onednn_backend(onednn_options opt = {});
  ~onednn_backend() override;

  std::string name() const override { return "onednn"; }
  std::string device_name() const override;
  bool computes_on_caller() const override { return n_threads_ == 1; }  // OpenMP's one thread is the caller
  int n_threads() const { return n_threads_; }
  // Number of distinct primitive configurations created so far (one per op and shape).
  std::size_t n_cached() const { return cache_.size(); }
  // How many of them run an implementation whose oneDNN name contains `impl` (e.g. "wino").
  std::size_t n_cached_running(const std::string& impl) const;
  // Convolution passes run so far on the backend's own few-channel loops (onednn_narrow_conv.cpp).
  std::size_t n_narrow_calls() const { return narrow_calls_; }

  void synchronize() override;
  void upload(const core::tensor& dst, const void* src) override;
  void download(const core::tensor& src, void* dst) override;
  void make_row_major(const core::tensor& t) override;
  // Reorders of a kept layout back to row-major so far (onednn_layout.cpp).
  std::size_t n_layout_reorders() const { return layout_reorders_; }

  // Element-wise ops run on either layout when their operands share it (onednn_layout.cpp).
  void fill(const core::tensor& t, float value) override;
  void copy(const core::tensor& src, const core::tensor& dst) override;
  void cast(const core::tensor& src, const core::tensor& dst) override;
  void add(const core::tensor& a, const core::tensor& b, const core::tensor& y) override;
  void mul(const core::tensor& a, const core::tensor& b, const core::tensor& y) override;
  void axpy(float alpha, const core::tensor& x, const core::tensor& y) override;
  void dropout_forward(const core::tensor& x, const core::tensor& y, const core::tensor& mask, float p,
                       std::uint32_t seed) override;
  void softmax_xent_forward(const core::tensor& logits, const core::tensor& labels, const core::tensor& probs,
                            const core::tensor& loss) override;
  void softmax_xent_backward(const core::tensor& probs, const core::tensor& labels, const core::tensor& dlogits,
                             float scale) override;

  void relu_forward(const core::tensor& x, const core::tensor& y) override;
  void relu_backward(const core::tensor& y, const core::tensor& dy, const core::tensor& dx) override;
  void clamp_forward(const core::tensor& x, const core::tensor& y, float lo, float hi) override;
  void clamp_backward(const core::tensor& y, const core::tensor& dy, const core::tensor& dx, float lo,
                      float hi) override;

  void matmul(const core::tensor& a, const core::tensor& b, const core::tensor& c, bool trans_a, bool trans_b,
              float alpha, float beta) override;
  void linear_forward(const core::tensor& x, const core::tensor& w, const core::tensor& b,
                      const core::tensor& y) override;
  void linear_backward_data(const core::tensor& dy, const core::tensor& w, const core::tensor& dx) override;
  void linear_backward_weights(const core::tensor& x, const core::tensor& dy, const core::tensor& dw,
                               const core::tensor& db) override;

  void conv2d_forward(const core::conv2d_desc& d, const core::tensor& x, const core::tensor& w, const core::tensor& b,
                      const core::tensor& y) override;
  void conv2d_backward_data(const core::conv2d_desc& d, const core::tensor& dy, const core::tensor& w,
                            const core::tensor& dx) override;
  void conv2d_backward_weights(const core::conv2d_desc& d, const core::tensor& x, const core::tensor& dy,
                               const core::tensor& dw, const core::tensor& db) override;

  void pool2d_forward(const core::pool2d_desc& d, const core::tensor& x, const core::tensor& y,
                      core::tensor* ws) override;
  void pool2d_backward(const core::pool2d_desc& d, const core::tensor& x, const core::tensor& dy,
                       const core::tensor& ws, const core::tensor& dx) override;

  void batchnorm_forward_train(const core::batchnorm_desc& d, const core::tensor& x, const core::tensor& gamma,
                               const core::tensor& beta, const core::tensor& y, const core::tensor& save_mean,
                               const core::tensor& save_invstd, const core::tensor& running_mean,
                               const core::tensor& running_var) override;
  void batchnorm_forward_infer(const core::batchnorm_desc& d, const core::tensor& x, const core::tensor& gamma,
                               const core::tensor& beta, const core::tensor& running_mean,
                               const core::tensor& running_var, const core::tensor& y) override;
  void batchnorm_backward(const core::batchnorm_desc& d, const core::tensor& x, const core::tensor& dy,
                          const core::tensor& gamma, const core::tensor& save_mean, const core::tensor& save_invstd,
                          const core::tensor& dx, const core::tensor& dgamma, const core::tensor& dbeta) override;

  void sgd_update(const core::sgd_desc& d, const core::tensor& param, const core::tensor& grad,
                  const core::tensor& momentum_buf) override;
  void adamw_update(const core::adamw_desc& d, const core::tensor& param, const core::tensor& grad,
                    const core::tensor& m, const core::tensor& v) override;

 private:
  // ---- activation layouts (onednn_layout.cpp) ----
  // What an op does with the notes over t's bytes: `read` keeps the one that covers exactly t
  // and returns its layout (0: row-major), making partial overlaps row-major; `row_major` makes
  // every overlapping one row-major; `overwrite` (t is about to be written whole) drops those
  // inside t and makes those reaching outside it row-major.
  enum class settle_mode { read, row_major, overwrite };
  int settle(const core::tensor& t, settle_mode mode);
  // The kept layout `t` holds (an id, 0: row-major).
  int layout_of(const core::tensor& t) { return settle(t, settle_mode::read); }
  // The same for an op that reads t as (N,C,H,W) images: 0 (after a reorder) unless the layout
  // describes t's own dimensions.
  int image_layout_of(const core::tensor& t);
  // Whether kept layout `id` describes t as (N,C,H,W) images of t's own dimensions.
  bool describes_images(int id, const core::tensor& t) const;
  // Before an op overwrites all of t.
  void claim(const core::tensor& t) { settle(t, settle_mode::overwrite); }
  // After an op wrote all of t in `layout` (0: row-major).
  void wrote(const core::tensor& t, int layout);
  // The layout a and b share (element-wise ops run on it), else both made row-major and 0.
  int shared_layout(const core::tensor& a, const core::tensor& b);
  // Every given tensor row-major (for ops that only know that order; undefined ones skipped).
  void row_major(std::initializer_list<const core::tensor*> ts);
  // The id of an activation layout a primitive chose, when it is one kept between ops (blocked,
  // unpadded), else 0.
  int keep_layout(const dnnl::memory::desc& md);
  const dnnl::memory::desc& layout_md(int id) const { return layouts_[static_cast<std::size_t>(id - 1)]; }
  // The channel block (8 or 16) of a kept layout.
  int layout_block(int id) const;
  // A tensor in kept layout `id` at src, row-major at dst / in place.
  void reorder_to_row_major(const void* src, void* dst, int id);
  void reorder_in_place(void* data, int id);
  // Batch norm on images in a kept blocked layout (onednn_norm.cpp).
  void bn_train_blocked(const core::batchnorm_desc& d, int block, const dnnl::memory::dims& dm, const core::tensor& x,
                        const core::tensor& gamma, const core::tensor& beta, const core::tensor& y,
                        const core::tensor& save_mean, const core::tensor& save_invstd,
                        const core::tensor& running_mean, const core::tensor& running_var);
  void bn_infer_blocked(const core::batchnorm_desc& d, int block, const dnnl::memory::dims& dm, const core::tensor& x,
                        const core::tensor& gamma, const core::tensor& beta, const core::tensor& running_mean,
                        const core::tensor& running_var, const core::tensor& y);
  void bn_backward_blocked(int block, const dnnl::memory::dims& dm, const core::tensor& x, const core::tensor& dy,
                           const core::tensor& gamma, const core::tensor& save_mean, const core::tensor& save_invstd,
                           const core::tensor& dx, const core::tensor& dgamma, const core::tensor& dbeta);

  // ReLU (relu) or clamp to [lo, hi] through oneDNN eltwise primitives; `what` names the op in errors.
  void eltwise_forward(const char* what, bool relu, float lo, float hi, const core::tensor& x, const core::tensor& y);
  void eltwise_backward(const char* what, bool relu, float lo, float hi, const core::tensor& y, const core::tensor& dy,
                        const core::tensor& dx);
  // Pointwise convolutions (1x1, stride 1, no padding, one group) as matrix products on the
  // caller's NCHW tensors, no reorders (onednn_pointwise.cpp); only under the automatic layout.
  bool pointwise(const core::conv2d_desc& d, const core::conv_dims& c) const;
  void pointwise_forward(const core::conv_dims& c, const float* x, const float* w, const float* b, float* y);
  void pointwise_backward_data(const core::conv_dims& c, const float* dy, const float* w, float* dx);
  void pointwise_backward_weights(const core::conv_dims& c, const float* x, const float* dy, float* dw, float* db);
  // Convolutions with few channels, where oneDNN's kernels pad channels to 16, on AVX-512
  // loops over the caller's NCHW tensors (onednn_narrow_conv.cpp); only under the automatic
  // layout and algorithm, and on CPUs with AVX-512.
  bool narrow(conv_op op, const core::conv2d_desc& d, const core::conv_dims& c) const;
  void narrow_forward(const core::conv2d_desc& d, const core::conv_dims& c, const float* x, const float* w,
                      const float* b, float* y);
  void narrow_backward_data(const core::conv2d_desc& d, const core::conv_dims& c, const float* dy, const float* w,
                            float* dx);
  void narrow_backward_weights(const core::conv2d_desc& d, const core::conv_dims& c, const float* x, const float* dy,
                               float* dw, float* db);
  // Threads for an op of `work` (see onednn_options::min_parallel_work).
  int threads_for(double work) const;
  // The cached plan for `key`, built by `build(planned_op&)` on first use; `work` (see
  // onednn_options::min_parallel_work) sets its thread count.
  template <class Build>
  planned_op& plan(const op_key& key, double work, Build&& build) {
    if (auto it = cache_.find(key); it != cache_.end()) return *it->second;
    auto op = std::make_unique<planned_op>(eng_, threads_for(work), min_parallel_work_);
    set_omp_threads(op->n_threads());
    build(*op);
    return *cache_.emplace(key, std::move(op)).first->second;
  }
  void run(planned_op& op, std::initializer_list<binding> args);
  // Scratch floats owned by the backend (batch-norm variances, column sums), valid until the next op.
  float* scratch_floats(std::size_t n, int which);

  int n_threads_;
  conv_layout layout_;
  pool_impl pooling_;
  conv_algorithm conv_;
  double min_parallel_work_;
  bool keep_layouts_;
  std::vector<dnnl::memory::desc> layouts_;  // kept layouts by id - 1
  std::vector<dnnl::reorder> to_row_major_;  // by id - 1, made on first use
  std::size_t layout_reorders_ = 0;
  dnnl::engine eng_;
  dnnl::stream stream_;
  scratch_arena arena_;
  std::unordered_map<op_key, std::unique_ptr<planned_op>, op_key_hash> cache_;
  std::vector<float> floats_[2];
  float alpha_ = 1.0f;
  std::size_t narrow_calls_ = 0;  // the runtime output scale of matmul
};

}  // namespace cleave::backend::detail
