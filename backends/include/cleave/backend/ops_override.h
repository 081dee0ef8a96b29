// Declares every compute op of core::backend as an override, for backends that implement the
// whole table themselves (one list instead of a copy in each backend's header).
#pragma once

#include "cleave/core/backend.h"

// clang-format off
#define CLEAVE_BACKEND_COMPUTE_OPS_OVERRIDE                                                                        \
  void fill(const ::cleave::core::tensor& t, float value) override;                                                \
  void copy(const ::cleave::core::tensor& src, const ::cleave::core::tensor& dst) override;                        \
  void cast(const ::cleave::core::tensor& src, const ::cleave::core::tensor& dst) override;                        \
  void add(const ::cleave::core::tensor& a, const ::cleave::core::tensor& b, const ::cleave::core::tensor& y)      \
      override;                                                                                                    \
  void mul(const ::cleave::core::tensor& a, const ::cleave::core::tensor& b, const ::cleave::core::tensor& y)      \
      override;                                                                                                    \
  void axpy(float alpha, const ::cleave::core::tensor& x, const ::cleave::core::tensor& y) override;               \
  void scale(const ::cleave::core::tensor& y, float alpha) override;                                               \
  void relu_forward(const ::cleave::core::tensor& x, const ::cleave::core::tensor& y) override;                    \
  void relu_backward(const ::cleave::core::tensor& y, const ::cleave::core::tensor& dy,                            \
                     const ::cleave::core::tensor& dx) override;                                                   \
  void clamp_forward(const ::cleave::core::tensor& x, const ::cleave::core::tensor& y, float lo, float hi)         \
      override;                                                                                                    \
  void clamp_backward(const ::cleave::core::tensor& y, const ::cleave::core::tensor& dy,                           \
                      const ::cleave::core::tensor& dx, float lo, float hi) override;                              \
  void dropout_forward(const ::cleave::core::tensor& x, const ::cleave::core::tensor& y,                           \
                       const ::cleave::core::tensor& mask, float p, std::uint32_t seed) override;                  \
  void matmul(const ::cleave::core::tensor& a, const ::cleave::core::tensor& b, const ::cleave::core::tensor& c,   \
              bool trans_a, bool trans_b, float alpha, float beta) override;                                       \
  void linear_forward(const ::cleave::core::tensor& x, const ::cleave::core::tensor& w,                            \
                      const ::cleave::core::tensor& b, const ::cleave::core::tensor& y) override;                  \
  void linear_backward_data(const ::cleave::core::tensor& dy, const ::cleave::core::tensor& w,                     \
                            const ::cleave::core::tensor& dx) override;                                            \
  void linear_backward_weights(const ::cleave::core::tensor& x, const ::cleave::core::tensor& dy,                  \
                               const ::cleave::core::tensor& dw, const ::cleave::core::tensor& db) override;       \
  void conv2d_forward(const ::cleave::core::conv2d_desc& d, const ::cleave::core::tensor& x,                       \
                      const ::cleave::core::tensor& w, const ::cleave::core::tensor& b,                            \
                      const ::cleave::core::tensor& y) override;                                                   \
  void conv2d_backward_data(const ::cleave::core::conv2d_desc& d, const ::cleave::core::tensor& dy,                \
                            const ::cleave::core::tensor& w, const ::cleave::core::tensor& dx) override;           \
  void conv2d_backward_weights(const ::cleave::core::conv2d_desc& d, const ::cleave::core::tensor& x,              \
                               const ::cleave::core::tensor& dy, const ::cleave::core::tensor& dw,                 \
                               const ::cleave::core::tensor& db) override;                                         \
  void pool2d_forward(const ::cleave::core::pool2d_desc& d, const ::cleave::core::tensor& x,                       \
                      const ::cleave::core::tensor& y, ::cleave::core::tensor* ws) override;                       \
  void pool2d_backward(const ::cleave::core::pool2d_desc& d, const ::cleave::core::tensor& x,                      \
                       const ::cleave::core::tensor& dy, const ::cleave::core::tensor& ws,                         \
                       const ::cleave::core::tensor& dx) override;                                                 \
  void batchnorm_forward_train(const ::cleave::core::batchnorm_desc& d, const ::cleave::core::tensor& x,           \
                               const ::cleave::core::tensor& gamma, const ::cleave::core::tensor& beta,            \
                               const ::cleave::core::tensor& y, const ::cleave::core::tensor& save_mean,           \
                               const ::cleave::core::tensor& save_invstd,                                          \
                               const ::cleave::core::tensor& running_mean,                                         \
                               const ::cleave::core::tensor& running_var) override;                                \
  void batchnorm_forward_infer(const ::cleave::core::batchnorm_desc& d, const ::cleave::core::tensor& x,           \
                               const ::cleave::core::tensor& gamma, const ::cleave::core::tensor& beta,            \
                               const ::cleave::core::tensor& running_mean,                                         \
                               const ::cleave::core::tensor& running_var,                                          \
                               const ::cleave::core::tensor& y) override;                                          \
  void batchnorm_backward(const ::cleave::core::batchnorm_desc& d, const ::cleave::core::tensor& x,                \
                          const ::cleave::core::tensor& dy, const ::cleave::core::tensor& gamma,                   \
                          const ::cleave::core::tensor& save_mean, const ::cleave::core::tensor& save_invstd,      \
                          const ::cleave::core::tensor& dx, const ::cleave::core::tensor& dgamma,                  \
                          const ::cleave::core::tensor& dbeta) override;                                           \
  void softmax_xent_forward(const ::cleave::core::tensor& logits, const ::cleave::core::tensor& labels,            \
                            const ::cleave::core::tensor& probs, const ::cleave::core::tensor& loss) override;     \
  void softmax_xent_backward(const ::cleave::core::tensor& probs, const ::cleave::core::tensor& labels,            \
                             const ::cleave::core::tensor& dlogits, float scale) override;                         \
  void sgd_update(const ::cleave::core::sgd_desc& d, const ::cleave::core::tensor& param,                          \
                  const ::cleave::core::tensor& grad, const ::cleave::core::tensor& momentum_buf) override;        \
  void adamw_update(const ::cleave::core::adamw_desc& d, const ::cleave::core::tensor& param,                      \
                    const ::cleave::core::tensor& grad, const ::cleave::core::tensor& m,                           \
                    const ::cleave::core::tensor& v) override;

// The optional cut-codec ops (core::backend's defaults run on the host), for device backends
// that run them where the tensor lives.
#define CLEAVE_BACKEND_CODEC_OPS_OVERRIDE                                                                          \
  void channel_absmax(const ::cleave::core::tensor& x, const ::cleave::core::tensor& amax) override;               \
  void quantize_int8(const ::cleave::core::tensor& x, const ::cleave::core::tensor& inv,                           \
                     const ::cleave::core::tensor& q, bool stochastic, std::uint32_t seed) override;               \
  void dequantize_int8(const ::cleave::core::tensor& q, const ::cleave::core::tensor& scales,                      \
                       const ::cleave::core::tensor& y) override;
// clang-format on
