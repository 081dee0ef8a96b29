// The reference backend: plain loops over host memory, written for clarity. It is the oracle
// every other backend is tested against; the onednn backend reuses its cheap element-wise ops.
#pragma once

#include "cleave/backend/ops_override.h"
#include "cleave/core/backend.h"

namespace cleave::backend::detail {

class reference_backend : public core::backend {
 public:
  std::string name() const override { return "reference"; }
  std::string device_name() const override { return "host CPU (plain loops)"; }
  bool host_memory() const override { return true; }
  bool computes_on_caller() const override { return true; }

  core::buffer_ptr allocate(std::size_t bytes) override;
  void upload(const core::tensor& dst, const void* src) override;
  void download(const core::tensor& src, void* dst) override;
  void synchronize() override {}
  void release_cached_memory() override;

  CLEAVE_BACKEND_COMPUTE_OPS_OVERRIDE
};

}  // namespace cleave::backend::detail
