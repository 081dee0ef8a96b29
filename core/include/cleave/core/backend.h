// The backend interface: memory and the compute ops every layer is built from. Each backend
// (reference, onednn, vulkan, cuda) implements this one table; the conformance suite checks
// every op of every backend against `reference`.
//
// Conventions for every op:
// - Tensors are dense, row-major, f32 unless stated; images are NCHW.
// - Every tensor passed to an op belongs to this backend (tensor::owner() == this).
// - Ops may run asynchronously; results are visible to download() and to later ops in
//   issue order. synchronize() waits for all issued work.
// - "overwrite" outputs are fully written; "+=" outputs are accumulated into (parameter
//   gradients accumulate over micro-batches, as in llm.c).
// - A backend object is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cleave/core/dtype.h"
#include "cleave/core/shape.h"
#include "cleave/core/tensor.h"

namespace cleave::core {

struct conv2d_desc {
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;  // zero padding on both sides
  // Grouped convolution: input and output channels split into `groups` equal groups, output
  // group j seeing input group j only; groups == C == K is a depthwise convolution.
  int groups = 1;
};

enum class pool_kind : std::uint8_t { max, avg };

struct pool2d_desc {
  pool_kind kind = pool_kind::max;
  int kernel_h = 2, kernel_w = 2;
  int stride_h = 2, stride_w = 2;
  int pad_h = 0, pad_w = 0;
  // max: padding counts as -inf, ties go to the first element in row-major window order.
  // avg: divides by kernel_h * kernel_w, padding counted as zeros (PyTorch's default).
};

struct batchnorm_desc {
  float eps = 1e-5f;
  float momentum = 0.1f;  // running = (1 - momentum) * running + momentum * batch statistic
};

// SGD as in PyTorch with dampening 0: g = grad + weight_decay * p;
// buf = momentum * buf + g; g = nesterov ? g + momentum * buf : buf; p -= lr * g.
// With momentum == 0 the buffer is neither read nor written.
struct sgd_desc {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

// AdamW as in PyTorch (decoupled weight decay): p *= 1 - lr * weight_decay;
// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps). step starts at 1.
struct adamw_desc {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  std::int64_t step = 1;
};

// Output spatial size of a convolution or pooling window.
constexpr std::int64_t window_out(std::int64_t in, int kernel, int stride, int pad) {
  return (in + 2 * pad - kernel) / stride + 1;
}

// A convolution's sizes: x (N,C,H,W), w (K,C/G,R,S), y (N,K,P,Q), G groups.
struct conv_dims {
  std::int64_t n, c, h, w, k, r, s, p, q;
  std::int64_t g = 1;
  std::int64_t cg() const { return c / g; }  // input channels per group
  std::int64_t kg() const { return k / g; }  // output channels per group
};
// The sizes of conv2d(x, w) -> y, checked against each other and the descriptor (a mismatch
// is a bug of the caller: CLEAVE_ASSERT).
conv_dims conv_dims_of(const conv2d_desc& d, const tensor& x, const tensor& w, const tensor& y);

class backend {
 public:
  virtual ~backend() = default;

  // ---- identity -------------------------------------------------------------------------
  virtual std::string name() const = 0;         // "reference", "onednn", ...
  virtual std::string device_name() const = 0;  // human-readable device, e.g. the GPU model
  // True when buffers are host memory (tensor::host_data() works).
  virtual bool host_memory() const = 0;
  // True when every kernel runs on the calling thread, so that thread's CPU time is the work's
  // cost (and a busy machine's preemptions are not).
  virtual bool computes_on_caller() const { return false; }

  // ---- memory ---------------------------------------------------------------------------
  // Returns at least `bytes` bytes (zero bytes allowed), aligned to 64 bytes.
  virtual buffer_ptr allocate(std::size_t bytes) = 0;
  tensor empty(const shape& s, dtype t = dtype::f32);
  tensor zeros(const shape& s, dtype t = dtype::f32);

  // dst.bytes() bytes from host memory into dst / from src into host memory. download()
  // waits for the work that produces src.
  virtual void upload(const tensor& dst, const void* src) = 0;
  virtual void download(const tensor& src, void* dst) = 0;
  // Waits until all issued work has finished.
  virtual void synchronize() = 0;
  // Code that reads or writes a host_memory() tensor through its pointer calls this first: a
  // backend may keep a tensor in a layout of its own between its ops (the oneDNN backend, its
  // activations in blocked layouts) and puts it back in the row-major order of its shape here.
  // Default: nothing (tensors are always row-major).
  virtual void make_row_major(const tensor& t) { (void)t; }
  // Optional (default: nothing): gives back memory the backend keeps for reuse but no tensor
  // uses, between phases that allocate different sizes (training, then evaluation).
  virtual void release_cached_memory() {}

  // ---- element-wise ---------------------------------------------------------------------
  // t (any shape, f32) = value (overwrite)
  virtual void fill(const tensor& t, float value) = 0;
  // src, dst (same dtype and numel): dst = src (overwrite)
  virtual void copy(const tensor& src, const tensor& dst) = 0;
  // src, dst (same numel, any dtypes): dst = convert(src) (overwrite). Float to integer rounds
  // to nearest even and saturates (NaN -> 0); to f16 / bf16 rounds to nearest even.
  virtual void cast(const tensor& src, const tensor& dst) = 0;
  // a, b, y (same numel): y = a + b (overwrite; y may alias a or b)
  virtual void add(const tensor& a, const tensor& b, const tensor& y) = 0;
  // a, b, y (same numel): y = a * b (overwrite; y may alias a or b)
  virtual void mul(const tensor& a, const tensor& b, const tensor& y) = 0;
  // x, y (same numel): y += alpha * x
  virtual void axpy(float alpha, const tensor& x, const tensor& y) = 0;
  // y (any): y *= alpha
  virtual void scale(const tensor& y, float alpha) = 0;

  // ---- activations ----------------------------------------------------------------------
  // x, y (same numel): y = max(x, 0) (overwrite; y may alias x)
  virtual void relu_forward(const tensor& x, const tensor& y) = 0;
  // y (the forward output), dy, dx (same numel): dx = y > 0 ? dy : 0 (overwrite; dx may alias dy)
  virtual void relu_backward(const tensor& y, const tensor& dy, const tensor& dx) = 0;
  // x, y (same numel), lo < hi: y = min(max(x, lo), hi) (overwrite; y may alias x). ReLU6 is
  // clamp(x, 0, 6).
  virtual void clamp_forward(const tensor& x, const tensor& y, float lo, float hi) = 0;
  // y (the forward output), dy, dx (same numel): dx = lo < y < hi ? dy : 0 (overwrite; dx may
  // alias dy), the gradient PyTorch's hardtanh gives (none at the bounds themselves).
  virtual void clamp_backward(const tensor& y, const tensor& dy, const tensor& dx, float lo, float hi) = 0;
  // x, y, mask (same numel): mask = dropout_keep(seed, i, keep_threshold(p)) ? 1/(1-p) : 0;
  // y = x * mask (overwrite). Backward is mul(dy, mask, dx). 0 <= p < 1.
  virtual void dropout_forward(const tensor& x, const tensor& y, const tensor& mask, float p, std::uint32_t seed) = 0;

  // ---- dense ----------------------------------------------------------------------------
  // a (M,K) or (K,M) if trans_a, b (K,N) or (N,K) if trans_b, c (M,N):
  // c = alpha * op(a) op(b) + beta * c (beta == 0: c is not read)
  virtual void matmul(const tensor& a, const tensor& b, const tensor& c, bool trans_a, bool trans_b, float alpha,
                      float beta) = 0;
  // x (N,I), w (O,I), b (O) or undefined, y (N,O): y = x w^T + b (overwrite)
  virtual void linear_forward(const tensor& x, const tensor& w, const tensor& b, const tensor& y) = 0;
  // dy (N,O), w (O,I), dx (N,I): dx = dy w (overwrite)
  virtual void linear_backward_data(const tensor& dy, const tensor& w, const tensor& dx) = 0;
  // x (N,I), dy (N,O), dw (O,I), db (O) or undefined: dw += dy^T x; db += sum_n dy
  virtual void linear_backward_weights(const tensor& x, const tensor& dy, const tensor& dw, const tensor& db) = 0;

  // ---- convolution (dilation 1; d.groups G divides C and K) -----------------------------
  // x (N,C,H,W), w (K,C/G,R,S), b (K) or undefined, y (N,K,P,Q) with P = window_out(H,R,..):
  // y = conv(x, w) + b (overwrite); output channel k reads input channels of group k/(K/G).
  virtual void conv2d_forward(const conv2d_desc& d, const tensor& x, const tensor& w, const tensor& b,
                              const tensor& y) = 0;
  // dy (N,K,P,Q), w (K,C/G,R,S), dx (N,C,H,W): dx = conv_transpose(dy, w) (overwrite)
  virtual void conv2d_backward_data(const conv2d_desc& d, const tensor& dy, const tensor& w, const tensor& dx) = 0;
  // x (N,C,H,W), dy (N,K,P,Q), dw (K,C/G,R,S), db (K) or undefined:
  // dw += correlation(x, dy); db += sum_{n,p,q} dy
  virtual void conv2d_backward_weights(const conv2d_desc& d, const tensor& x, const tensor& dy, const tensor& dw,
                                       const tensor& db) = 0;

  // ---- pooling --------------------------------------------------------------------------
  // x (N,C,H,W), y (N,C,P,Q) (overwrite). When ws is non-null (training), *ws receives a
  // backend-defined workspace (allocated by the backend) that pool2d_backward consumes.
  virtual void pool2d_forward(const pool2d_desc& d, const tensor& x, const tensor& y, tensor* ws) = 0;
  // x (N,C,H,W), dy (N,C,P,Q), ws from forward, dx (N,C,H,W): dx = pool_backward(dy) (overwrite)
  virtual void pool2d_backward(const pool2d_desc& d, const tensor& x, const tensor& dy, const tensor& ws,
                               const tensor& dx) = 0;

  // ---- batch normalisation (per channel over N,H,W; rank-2 input (N,C) also allowed) ----
  // x, y (N,C,H,W), gamma, beta, save_mean, save_invstd, running_mean, running_var (C):
  // mean, var = batch statistics (biased var); save_invstd = 1/sqrt(var + eps);
  // y = gamma (x - mean) save_invstd + beta (overwrite);
  // running_var uses the unbiased var (times n/(n-1), n = N*H*W), as PyTorch.
  virtual void batchnorm_forward_train(const batchnorm_desc& d, const tensor& x, const tensor& gamma,
                                       const tensor& beta, const tensor& y, const tensor& save_mean,
                                       const tensor& save_invstd, const tensor& running_mean,
                                       const tensor& running_var) = 0;
  // y = gamma (x - running_mean) / sqrt(running_var + eps) + beta (overwrite)
  virtual void batchnorm_forward_infer(const batchnorm_desc& d, const tensor& x, const tensor& gamma,
                                       const tensor& beta, const tensor& running_mean, const tensor& running_var,
                                       const tensor& y) = 0;
  // x, dy, dx (N,C,H,W), gamma, save_mean, save_invstd, dgamma, dbeta (C):
  // dx (overwrite), dgamma += sum dy * xhat, dbeta += sum dy
  virtual void batchnorm_backward(const batchnorm_desc& d, const tensor& x, const tensor& dy, const tensor& gamma,
                                  const tensor& save_mean, const tensor& save_invstd, const tensor& dx,
                                  const tensor& dgamma, const tensor& dbeta) = 0;

  // ---- loss -----------------------------------------------------------------------------
  // logits (N,K), labels (N) i32 in [0,K), probs (N,K), loss (1):
  // probs = softmax(logits) (overwrite); loss = mean_n -log probs[n, label_n] (overwrite)
  virtual void softmax_xent_forward(const tensor& logits, const tensor& labels, const tensor& probs,
                                    const tensor& loss) = 0;
  // probs (N,K), labels (N) i32, dlogits (N,K): dlogits = (probs - onehot(labels)) * scale / N
  virtual void softmax_xent_backward(const tensor& probs, const tensor& labels, const tensor& dlogits, float scale) = 0;

  // ---- cut codecs: the int8 codec of core/codec.h, where the tensor lives ------------------
  // Channels are dim 1 of a rank >= 2 tensor (one channel otherwise), as core::channel_layout_of.
  // Optional: the defaults run core/codec.h's host loops, on host memory in place, else through
  // download() and upload(). Results must equal those loops' bit for bit.
  // x (N,C,...) f32, amax (C) f32: amax[c] = max |x| over channel c, NaN where the channel holds
  // a non-finite value (overwrite).
  virtual void channel_absmax(const tensor& x, const tensor& amax);
  // x (N,C,...) f32, inv (C) f32, q (same numel) i8: q = clamp(round_even(x * inv[c]), -127, 127),
  // 0 where that is NaN; stochastic: clamp(floor(x * inv[c] + u), -127, 127) with
  // u = (hash32(seed, e) >> 8) / 2^24, e the flat index (overwrite).
  virtual void quantize_int8(const tensor& x, const tensor& inv, const tensor& q, bool stochastic, std::uint32_t seed);
  // q (N,C,...) i8, scales (C) f32, y (same numel) f32: y = q * scales[c] (overwrite).
  virtual void dequantize_int8(const tensor& q, const tensor& scales, const tensor& y);

  // ---- optimizer updates over flat parameter buffers ------------------------------------
  // param, grad, momentum_buf (same numel, f32): see sgd_desc. momentum_buf may be undefined
  // when d.momentum == 0.
  virtual void sgd_update(const sgd_desc& d, const tensor& param, const tensor& grad, const tensor& momentum_buf) = 0;
  // param, grad, m, v (same numel, f32): see adamw_desc.
  virtual void adamw_update(const adamw_desc& d, const tensor& param, const tensor& grad, const tensor& m,
                            const tensor& v) = 0;
};

// keep_threshold for dropout_keep() given a drop probability p in [0, 1).
std::uint32_t dropout_threshold(float p);

// Checks that every tensor in an op call is defined, on backend `b`, f32 and of `numel`:
// used by backends to reject programmer errors early with a clear message.
void expect_f32(const backend& b, const tensor& t, const char* what);

}  // namespace cleave::core
