// The vulkan backend: core::backend on a Vulkan compute device. Tensors are ranges of pooled
// device memory; ops are recorded as compute dispatches into a batch that is submitted when the
// host needs a result. Shaders are in shaders/, compiled at build time and embedded.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

#include "cleave/backend/ops_override.h"
#include "cleave/core/backend.h"
#include "vk_device.h"
#include "vk_memory.h"
#include "vk_stream.h"

namespace cleave::backend::vk {

class vulkan_backend final : public core::backend {
 public:
  // `device_spec`: "" (the preferred device), an index, or a name substring; see select_device.
  explicit vulkan_backend(const std::string& device_spec);
  ~vulkan_backend() override;

  std::string name() const override { return "vulkan"; }
  std::string device_name() const override;
  bool host_memory() const override { return false; }

  core::buffer_ptr allocate(std::size_t bytes) override;
  void upload(const core::tensor& dst, const void* src) override;
  void download(const core::tensor& src, void* dst) override;
  void synchronize() override;

  CLEAVE_BACKEND_COMPUTE_OPS_OVERRIDE
  CLEAVE_BACKEND_CODEC_OPS_OVERRIDE

  // ---- introspection for tests and benchmarks ----------------------------------------------
  const device& vk_device() const { return *dev_; }
  memory_pool::stats pool_stats() const { return pool_->get_stats(); }
  // Whether uploads and downloads copy straight through mapped tensor memory (else staging).
  bool direct_transfers() const { return pool_->mapped(); }
  const stream::stats& stream_stats() const { return stream_->get_stats(); }
  // Submit a batch once it holds this many commands (default 1024).
  void set_batch_limit(std::uint32_t n) { stream_->set_batch_limit(n); }
  // Caps workgroups per dispatch along x below the device's limit (to test chunked dispatch).
  void set_max_workgroups_x(std::uint32_t n) { max_groups_x_ = n; }

 private:
  // A tensor bound to a shader: its binding and its first element's offset within it, in
  // 4-byte words and in bytes.
  struct bound {
    binding b;
    std::uint32_t word = 0;
    std::uint32_t byte = 0;
  };
  bound bind(const core::tensor& t, bool write) const;
  // A small buffer bound where a shader's optional operand is absent.
  bound dummy() const;
  bound bind_opt(const core::tensor& t, bool write) const { return t.defined() ? bind(t, write) : dummy(); }
  void run(std::string_view shader, std::initializer_list<bound> args, const void* push, std::uint32_t push_bytes,
           std::uint32_t gx, std::uint32_t gy = 1, std::uint32_t gz = 1, std::span<const std::uint32_t> spec = {});
  template <class Push>
  void run(std::string_view shader, std::initializer_list<bound> args, const Push& push, std::uint32_t gx,
           std::uint32_t gy = 1, std::uint32_t gz = 1, std::span<const std::uint32_t> spec = {}) {
    static_assert(sizeof(Push) <= push_constant_bytes);
    run(shader, args, &push, sizeof(Push), gx, gy, gz, spec);
  }
  // Workgroups for a grid-stride loop over n items.
  static std::uint32_t groups_for(std::int64_t n);
  void eltwise(std::uint32_t op, const core::tensor& a, const core::tensor& b, const core::tensor& y, float alpha,
               float beta = 0.0f);

  struct gemm_args;
  void gemm(std::string_view shader, gemm_args& g, const bound& a, const bound& b, const bound& c, const bound& bias);

  std::shared_ptr<device> dev_;
  std::shared_ptr<memory_pool> pool_;     // tensors
  std::shared_ptr<memory_pool> staging_;  // host-visible staging for devices whose memory is not
  std::unique_ptr<stream> stream_;
  core::buffer_ptr dummy_;
  std::uint32_t max_groups_x_ = 0;  // 0: the device's maxComputeWorkGroupCount[0]
};

}  // namespace cleave::backend::vk
