// The reference backend: plain loops over host memory, written for clarity. It is the oracle
// every other backend is tested against; the onednn backend reuses its cheap element-wise ops.
#pragma once

#include "cleave/core/backend.h"

namespace cleave::backend::detail {

class reference_backend : public core::backend {
 public:
  std::string name() const override { return "reference"; }
  std::string device_name() const override { return "host CPU (plain loops)"; }
  bool host_memory() const override { return true; }

  core::buffer_ptr allocate(std::size_t bytes) override;
  void upload(const core::tensor& dst, const void* src) override;
  void download(const core::tensor& src, void* dst) override;
  void synchronize() override {}

  void fill(const core::tensor& t, float value) override;
  void copy(const core::tensor& src, const core::tensor& dst) override;
  void cast(const core::tensor& src, const core::tensor& dst) override;
  void add(const core::tensor& a, const core::tensor& b, const core::tensor& y) override;
  void mul(const core::tensor& a, const core::tensor& b, const core::tensor& y) override;
  void axpy(float alpha, const core::tensor& x, const core::tensor& y) override;
  void scale(const core::tensor& y, float alpha) override;

  void relu_forward(const core::tensor& x, const core::tensor& y) override;
  void relu_backward(const core::tensor& y, const core::tensor& dy, const core::tensor& dx) override;
  void dropout_forward(const core::tensor& x, const core::tensor& y, const core::tensor& mask, float p,
                       std::uint32_t seed) override;

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

  void softmax_xent_forward(const core::tensor& logits, const core::tensor& labels, const core::tensor& probs,
                            const core::tensor& loss) override;
  void softmax_xent_backward(const core::tensor& probs, const core::tensor& labels, const core::tensor& dlogits,
                             float scale) override;

  void sgd_update(const core::sgd_desc& d, const core::tensor& param, const core::tensor& grad,
                  const core::tensor& momentum_buf) override;
  void adamw_update(const core::adamw_desc& d, const core::tensor& param, const core::tensor& grad,
                    const core::tensor& m, const core::tensor& v) override;
};

}  // namespace cleave::backend::detail
