// vulkan backend: construction, memory and transfers, element-wise ops, casts, dropout, and the
// registry hooks. Dense and convolution ops are in vulkan_dense.cpp, the other layers in
// vulkan_layers.cpp.
#include "vulkan_backend.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>

#include "cleave/core/error.h"
#include "cleave/core/random.h"
#include "factory.h"
#include "vk_check.h"

namespace cleave::backend::vk {

using core::tensor;

namespace {

constexpr VkDeviceSize tensor_block_bytes = VkDeviceSize{64} << 20;
constexpr VkDeviceSize staging_block_bytes = VkDeviceSize{16} << 20;

VkDeviceSize round_up4(VkDeviceSize v) {
  return (v + 3) & ~VkDeviceSize{3};
}

void same_numel(const tensor& a, const tensor& b, const char* op) {
  CLEAVE_ASSERT(a.numel() == b.numel(),
                std::string(op) + ": element counts differ: " + a.shape().str() + " vs " + b.shape().str());
}

std::uint32_t u32(std::int64_t v) {
  CLEAVE_ASSERT(v >= 0 && v <= 0xffffffffLL, "size does not fit the 32-bit indexing of the vulkan shaders");
  return static_cast<std::uint32_t>(v);
}

// Push constants of eltwise.comp.
struct eltwise_push {
  std::uint32_t n, off_a, off_b, off_y;
  float alpha, beta;
};
enum eltwise_op : std::uint32_t {
  op_add,
  op_mul,
  op_axpy,
  op_scale,
  op_relu,
  op_relu_bwd,
  op_fill,
  op_clamp,
  op_clamp_bwd
};

}  // namespace

vulkan_backend::vulkan_backend(const std::string& device_spec) : dev_(device::get(device_spec)) {
  // CLEAVE_VK_STAGING=1 moves every transfer through staging memory even where tensor memory
  // is host-visible: the path discrete GPUs take, for testing it on integrated or CPU devices.
  const char* force_staging = std::getenv("CLEAVE_VK_STAGING");
  const bool mapped =
      dev_->tensor_memory_mappable() && !(force_staging && std::strcmp(force_staging, "0") != 0 && *force_staging);
  pool_ = std::make_shared<memory_pool>(dev_, dev_->tensor_memory_type(), mapped, tensor_block_bytes);
  staging_ = std::make_shared<memory_pool>(dev_, dev_->staging_memory_type(), true, staging_block_bytes);
  stream_ = std::make_unique<stream>(dev_, std::vector<memory_pool*>{pool_.get(), staging_.get()});
  dummy_ = allocate(256);
}

vulkan_backend::~vulkan_backend() {
  stream_.reset();  // waits for all submitted work
  dummy_.reset();
}

std::string vulkan_backend::device_name() const {
  return dev_->physical().name + " (" + device_type_name(dev_->physical().type) + ")";
}

// ---- memory -----------------------------------------------------------------------------

core::buffer_ptr vulkan_backend::allocate(std::size_t bytes) {
  if (bytes == 0) return std::make_shared<vk_buffer>(this, 0, pool_, memory_pool::allocation{});
  return std::make_shared<vk_buffer>(this, bytes, pool_, pool_->allocate(bytes));
}

vulkan_backend::bound vulkan_backend::bind(const tensor& t, bool write) const {
  CLEAVE_ASSERT(t.defined(), "vulkan: binding an undefined tensor");
  CLEAVE_ASSERT(t.owner() == this, "vulkan: tensor belongs to another backend");
  const auto* vb = static_cast<const vk_buffer*>(t.buf());
  const auto& a = vb->alloc();
  if (t.bytes() == 0 || !a.blk) return dummy();
  const VkDeviceSize abs = a.offset + t.offset();
  CLEAVE_ASSERT(abs % core::dtype_size(t.dtype()) == 0, "vulkan: tensor view is not aligned to its element size");
  const VkDeviceSize align = dev_->limits().minStorageBufferOffsetAlignment;
  const VkDeviceSize base = abs / align * align;
  const VkDeviceSize end = round_up4(abs + t.bytes());
  bound r;
  r.b.buffer = a.blk->buffer;
  r.b.offset = base;
  r.b.range = end - base;
  r.b.touched = {a.blk, abs & ~VkDeviceSize{3}, end, write};
  r.byte = static_cast<std::uint32_t>(abs - base);
  r.word = r.byte / 4;
  return r;
}

vulkan_backend::bound vulkan_backend::dummy() const {
  const auto* vb = static_cast<const vk_buffer*>(dummy_.get());
  bound r;
  r.b.buffer = vb->alloc().blk->buffer;
  r.b.offset = vb->alloc().offset;
  r.b.range = vb->bytes();
  // Never read or written by a shader: no hazard to track.
  r.b.touched = {};
  return r;
}

std::uint32_t vulkan_backend::groups_for(std::int64_t n) {
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>((n + 255) / 256, 1, 65535));
}

void vulkan_backend::run(std::string_view shader, std::initializer_list<bound> args, const void* push,
                         std::uint32_t push_bytes, std::uint32_t gx, std::uint32_t gy, std::uint32_t gz,
                         std::span<const std::uint32_t> spec) {
  const pipeline& p = dev_->get_pipeline(shader, static_cast<std::uint32_t>(args.size()), spec);
  std::array<binding, 8> b;
  std::size_t i = 0;
  for (const auto& a : args) b[i++] = a.b;
  stream_->dispatch(p, std::span(b.data(), i), push, push_bytes, gx, gy, gz);
}

namespace {

// The exact bytes of a tensor, for transfer commands (which need no alignment).
binding copy_binding(const tensor& t, bool write) {
  const auto& a = static_cast<const vk_buffer*>(t.buf())->alloc();
  const VkDeviceSize abs = a.offset + t.offset();
  binding b;
  b.buffer = a.blk->buffer;
  b.offset = abs;
  b.range = t.bytes();
  b.touched = {a.blk, abs & ~VkDeviceSize{3}, round_up4(abs + t.bytes()), write};
  return b;
}

binding staging_binding(const memory_pool::allocation& s, VkDeviceSize bytes, bool write) {
  binding b;
  b.buffer = s.blk->buffer;
  b.offset = s.offset;
  b.range = bytes;
  b.touched = {s.blk, s.offset, s.offset + round_up4(bytes), write};
  return b;
}

}  // namespace

void vulkan_backend::upload(const tensor& dst, const void* src) {
  CLEAVE_ASSERT(dst.owner() == this, "upload: tensor belongs to another backend");
  const VkDeviceSize bytes = dst.bytes();
  if (bytes == 0) return;
  const binding d = copy_binding(dst, true);
  // Write straight into mapped device memory when no recorded or running command can touch it.
  if (pool_->mapped() && !stream_->in_flight() && !stream_->batch_touches(d.touched, false)) {
    std::memcpy(d.touched.blk->mapped + d.offset, src, bytes);
    return;
  }
  // Otherwise stage the data and record a copy, which keeps the order of the ops around it.
  const auto s = staging_->allocate(bytes);
  std::memcpy(s.blk->mapped + s.offset, src, bytes);
  stream_->copy(staging_binding(s, bytes, false), d);
  staging_->release(s);
}

void vulkan_backend::download(const tensor& src, void* dst) {
  CLEAVE_ASSERT(src.owner() == this, "download: tensor belongs to another backend");
  const VkDeviceSize bytes = src.bytes();
  if (bytes == 0) return;
  const binding s = copy_binding(src, false);
  if (pool_->mapped()) {
    // Submit only when the batch being recorded writes this tensor.
    if (stream_->batch_touches(s.touched, true))
      stream_->flush(true);
    else if (stream_->in_flight())
      stream_->wait_in_flight();
    std::memcpy(dst, s.touched.blk->mapped + s.offset, bytes);
    return;
  }
  const auto st = staging_->allocate(bytes);
  stream_->copy(s, staging_binding(st, bytes, true));
  stream_->flush(true);
  std::memcpy(dst, st.blk->mapped + st.offset, bytes);
  staging_->release(st);
}

void vulkan_backend::synchronize() {
  stream_->flush(true);
}

// ---- element-wise -------------------------------------------------------------------------

void vulkan_backend::eltwise(std::uint32_t op, const tensor& a, const tensor& b, const tensor& y, float alpha,
                             float beta) {
  const std::int64_t n = y.numel();
  if (n == 0) return;
  const bound ba = a.defined() ? bind(a, false) : dummy();
  const bound bb = b.defined() ? bind(b, false) : dummy();
  const bound by = bind(y, true);
  const eltwise_push pc{u32(n), ba.word, bb.word, by.word, alpha, beta};
  const std::array<std::uint32_t, 1> spec{op};
  run("eltwise", {ba, bb, by}, pc, groups_for(n), 1, 1, spec);
}

void vulkan_backend::fill(const tensor& t, float value) {
  core::expect_f32(*this, t, "fill: t");
  eltwise(op_fill, {}, {}, t, value);
}

void vulkan_backend::copy(const tensor& src, const tensor& dst) {
  CLEAVE_ASSERT(src.dtype() == dst.dtype(), "copy: dtypes differ");
  same_numel(src, dst, "copy");
  CLEAVE_ASSERT(src.owner() == this && dst.owner() == this, "copy: tensor belongs to another backend");
  if (src.bytes() == 0) return;
  const binding s = copy_binding(src, false), d = copy_binding(dst, true);
  if (s.buffer == d.buffer && s.offset == d.offset) return;
  const bool overlap = s.buffer == d.buffer && s.offset < d.offset + d.range && d.offset < s.offset + s.range;
  if (!overlap) {
    stream_->copy(s, d);
    return;
  }
  // vkCmdCopyBuffer needs disjoint regions: go through a temporary (memmove semantics).
  tensor tmp = empty(src.shape(), src.dtype());
  stream_->copy(s, copy_binding(tmp, true));
  stream_->copy(copy_binding(tmp, false), d);
}

void vulkan_backend::cast(const tensor& src, const tensor& dst) {
  same_numel(src, dst, "cast");
  if (src.dtype() == dst.dtype()) return copy(src, dst);
  const std::int64_t n = src.numel();
  if (n == 0) return;
  const bound bs = bind(src, false), bd = bind(dst, true);
  struct {
    std::uint32_t n, src_byte, dst_byte, src_type, dst_type, first_word, n_words;
  } pc{u32(n),
       bs.byte,
       bd.byte,
       static_cast<std::uint32_t>(src.dtype()),
       static_cast<std::uint32_t>(dst.dtype()),
       bd.byte / 4,
       static_cast<std::uint32_t>((round_up4(bd.byte + dst.bytes())) / 4 - bd.byte / 4)};
  run("cast", {bs, bd}, pc, groups_for(pc.n_words));
}

void vulkan_backend::add(const tensor& a, const tensor& b, const tensor& y) {
  same_numel(a, y, "add");
  same_numel(b, y, "add");
  core::expect_f32(*this, a, "add: a");
  core::expect_f32(*this, b, "add: b");
  core::expect_f32(*this, y, "add: y");
  eltwise(op_add, a, b, y, 0.0f);
}

void vulkan_backend::mul(const tensor& a, const tensor& b, const tensor& y) {
  same_numel(a, y, "mul");
  same_numel(b, y, "mul");
  core::expect_f32(*this, a, "mul: a");
  core::expect_f32(*this, b, "mul: b");
  core::expect_f32(*this, y, "mul: y");
  eltwise(op_mul, a, b, y, 0.0f);
}

void vulkan_backend::axpy(float alpha, const tensor& x, const tensor& y) {
  same_numel(x, y, "axpy");
  core::expect_f32(*this, x, "axpy: x");
  core::expect_f32(*this, y, "axpy: y");
  eltwise(op_axpy, x, {}, y, alpha);
}

void vulkan_backend::scale(const tensor& y, float alpha) {
  core::expect_f32(*this, y, "scale: y");
  eltwise(op_scale, {}, {}, y, alpha);
}

void vulkan_backend::relu_forward(const tensor& x, const tensor& y) {
  same_numel(x, y, "relu_forward");
  core::expect_f32(*this, x, "relu_forward: x");
  core::expect_f32(*this, y, "relu_forward: y");
  eltwise(op_relu, x, {}, y, 0.0f);
}

void vulkan_backend::relu_backward(const tensor& y, const tensor& dy, const tensor& dx) {
  same_numel(y, dy, "relu_backward");
  same_numel(dy, dx, "relu_backward");
  core::expect_f32(*this, y, "relu_backward: y");
  core::expect_f32(*this, dy, "relu_backward: dy");
  core::expect_f32(*this, dx, "relu_backward: dx");
  eltwise(op_relu_bwd, y, dy, dx, 0.0f);
}

void vulkan_backend::clamp_forward(const tensor& x, const tensor& y, float lo, float hi) {
  same_numel(x, y, "clamp_forward");
  CLEAVE_ASSERT(lo < hi, "clamp_forward: lo must be below hi");
  core::expect_f32(*this, x, "clamp_forward: x");
  core::expect_f32(*this, y, "clamp_forward: y");
  eltwise(op_clamp, x, {}, y, lo, hi);
}

void vulkan_backend::clamp_backward(const tensor& y, const tensor& dy, const tensor& dx, float lo, float hi) {
  same_numel(y, dy, "clamp_backward");
  same_numel(dy, dx, "clamp_backward");
  core::expect_f32(*this, y, "clamp_backward: y");
  core::expect_f32(*this, dy, "clamp_backward: dy");
  core::expect_f32(*this, dx, "clamp_backward: dx");
  eltwise(op_clamp_bwd, y, dy, dx, lo, hi);
}

void vulkan_backend::dropout_forward(const tensor& x, const tensor& y, const tensor& mask, float p,
                                     std::uint32_t seed) {
  same_numel(x, y, "dropout_forward");
  same_numel(x, mask, "dropout_forward");
  CLEAVE_ASSERT(p >= 0.0f && p < 1.0f, "dropout probability out of [0,1)");
  core::expect_f32(*this, x, "dropout_forward: x");
  core::expect_f32(*this, y, "dropout_forward: y");
  core::expect_f32(*this, mask, "dropout_forward: mask");
  const std::int64_t n = x.numel();
  if (n == 0) return;
  const bound bx = bind(x, false), by = bind(y, true), bm = bind(mask, true);
  struct {
    std::uint32_t n, off_x, off_y, off_m, seed, threshold;
    float keep_scale;
  } pc{u32(n), bx.word, by.word, bm.word, seed, core::dropout_threshold(p), 1.0f / (1.0f - p)};
  run("dropout", {bx, by, bm}, pc, groups_for(n));
}

}  // namespace cleave::backend::vk

// ---- registry hooks -----------------------------------------------------------------------

namespace cleave::backend::detail {

backend_info probe_vulkan() {
  // The device list does not change while the process runs: probe once.
  static const backend_info info = []() -> backend_info {
    try {
      const auto inst = vk::instance::get();
      if (inst->devices().empty())
        return {"vulkan", false, "no Vulkan 1.1 device with a compute queue was found", false};
      const auto& d = vk::select_device(inst->devices(), "");
      return {"vulkan", true, d.name + " (" + vk::device_type_name(d.type) + ")", vk::is_real_gpu(d.type)};
    } catch (const core::error& e) {
      return {"vulkan", false, e.what(), false};
    }
  }();
  return info;
}

std::unique_ptr<core::backend> create_vulkan(const std::string& device) {
  return std::make_unique<vk::vulkan_backend>(device);
}

}  // namespace cleave::backend::detail
