// Command batching with hazard-tracked barriers, per-frame descriptor pools and fences.
#include "vk_stream.h"

#include <cstring>

#include "cleave/core/error.h"
#include "vk_check.h"

namespace cleave::backend::vk {

namespace {

bool overlaps(const access& a, const access& b) {
  return a.blk == b.blk && a.begin < b.end && b.begin < a.end;
}

constexpr VkPipelineStageFlags work_stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
constexpr std::uint32_t sets_per_pool = 256;
constexpr std::uint32_t max_bindings = 8;

}  // namespace

stream::stream(std::shared_ptr<device> dev, std::vector<memory_pool*> pools)
    : dev_(std::move(dev)), pools_(std::move(pools)) {
  VkDevice d = dev_->handle();
  for (auto& f : frames_) {
    VkCommandPoolCreateInfo pool{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pool.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
    pool.queueFamilyIndex = dev_->queue_family();
    CLEAVE_CHECK_VK(vkCreateCommandPool(d, &pool, nullptr, &f.pool));
    VkCommandBufferAllocateInfo alloc{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    alloc.commandPool = f.pool;
    alloc.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    alloc.commandBufferCount = 1;
    CLEAVE_CHECK_VK(vkAllocateCommandBuffers(d, &alloc, &f.cmd));
    VkFenceCreateInfo fence{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    CLEAVE_CHECK_VK(vkCreateFence(d, &fence, nullptr, &f.fence));
  }
}

stream::~stream() {
  VkDevice d = dev_->handle();
  try {
    flush(true);
  } catch (const core::error&) {
    vkDeviceWaitIdle(d);  // device lost or similar: nothing more to do than release
  }
  for (auto& f : frames_) {
    for (auto p : f.descriptor_pools) vkDestroyDescriptorPool(d, p, nullptr);
    vkDestroyFence(d, f.fence, nullptr);
    vkDestroyCommandPool(d, f.pool, nullptr);
  }
  // Nothing of ours runs any more: every released range may be reused.
  for (auto* p : pools_) p->set_completed_serial(last_serial_);
}

VkDescriptorPool stream::new_descriptor_pool() {
  VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, sets_per_pool * max_bindings};
  VkDescriptorPoolCreateInfo info{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  info.maxSets = sets_per_pool;
  info.poolSizeCount = 1;
  info.pPoolSizes = &size;
  VkDescriptorPool pool = VK_NULL_HANDLE;
  CLEAVE_CHECK_VK(vkCreateDescriptorPool(dev_->handle(), &info, nullptr, &pool));
  return pool;
}

void stream::wait_frame(frame& f) {
  if (!f.in_flight) return;
  CLEAVE_CHECK_VK(vkWaitForFences(dev_->handle(), 1, &f.fence, VK_TRUE, UINT64_MAX));
  f.in_flight = false;
  completed(f.serial);
}

void stream::completed(std::uint64_t serial) {
  // Batches finish in submission order on one queue, so `serial` covers every earlier one.
  for (auto* p : pools_) p->set_completed_serial(serial);
}

void stream::begin_batch() {
  frame& f = frames_[current_];
  wait_frame(f);
  VkDevice d = dev_->handle();
  CLEAVE_CHECK_VK(vkResetFences(d, 1, &f.fence));
  CLEAVE_CHECK_VK(vkResetCommandPool(d, f.pool, 0));
  for (auto p : f.descriptor_pools) CLEAVE_CHECK_VK(vkResetDescriptorPool(d, p, 0));
  f.active_pool = 0;
  f.serial = ++last_serial_;
  for (auto* p : pools_) p->set_recording_serial(f.serial);
  VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  CLEAVE_CHECK_VK(vkBeginCommandBuffer(f.cmd, &begin));
  recording_ = true;
  n_commands_ = 0;
  since_barrier_.clear();
  batch_.clear();
  // Work of an earlier batch may still run: order this batch after it.
  if (in_flight()) barrier();
}

bool stream::in_flight() const {
  for (const auto& f : frames_)
    if (f.in_flight) return true;
  return false;
}

bool stream::batch_touches(const access& a, bool write_only) const {
  if (!recording_) return false;
  for (const auto& b : batch_)
    if ((b.write || !write_only) && overlaps(a, b)) return true;
  return false;
}

void stream::barrier() {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT;
  vkCmdPipelineBarrier(frames_[current_].cmd, work_stages, work_stages, 0, 1, &mb, 0, nullptr, 0, nullptr);
  since_barrier_.clear();
  ++stats_.n_barriers;
}

void stream::before_command(std::span<const access> accesses) {
  if (!recording_) begin_batch();
  bool hazard = false;
  for (const auto& a : accesses) {
    for (const auto& b : since_barrier_) {
      // read after write, write after write, write after read
      if (overlaps(a, b) && (a.write || b.write)) {
        hazard = true;
        break;
      }
    }
    if (hazard) break;
  }
  if (hazard) barrier();
  for (const auto& a : accesses) {
    if (!a.blk) continue;
    since_barrier_.push_back(a);
    batch_.push_back(a);
  }
  ++n_commands_;
}

VkDescriptorSet stream::allocate_set(VkDescriptorSetLayout layout) {
  frame& f = frames_[current_];
  for (;;) {
    if (f.active_pool == f.descriptor_pools.size()) f.descriptor_pools.push_back(new_descriptor_pool());
    VkDescriptorSetAllocateInfo info{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    info.descriptorPool = f.descriptor_pools[f.active_pool];
    info.descriptorSetCount = 1;
    info.pSetLayouts = &layout;
    VkDescriptorSet set = VK_NULL_HANDLE;
    const VkResult r = vkAllocateDescriptorSets(dev_->handle(), &info, &set);
    if (r == VK_SUCCESS) return set;
    if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL)
      throw_vk_error("vkAllocateDescriptorSets", r, __FILE__, __LINE__);
    ++f.active_pool;  // this pool is full: move to the next (created on demand)
  }
}

void stream::dispatch(const pipeline& p, std::span<const binding> bindings, const void* push, std::uint32_t push_bytes,
                      std::uint32_t gx, std::uint32_t gy, std::uint32_t gz) {
  CLEAVE_ASSERT(bindings.size() == p.n_bindings && bindings.size() <= max_bindings, "dispatch: binding count");
  CLEAVE_ASSERT(push_bytes <= push_constant_bytes, "dispatch: push constants too large");
  if (gx == 0 || gy == 0 || gz == 0) return;
  const auto& lim = dev_->limits();
  CLEAVE_ASSERT(gx <= lim.maxComputeWorkGroupCount[0] && gy <= lim.maxComputeWorkGroupCount[1] &&
                    gz <= lim.maxComputeWorkGroupCount[2],
                "dispatch: grid exceeds maxComputeWorkGroupCount");
  std::array<access, max_bindings> acc;
  for (std::size_t i = 0; i < bindings.size(); ++i) acc[i] = bindings[i].touched;
  before_command(std::span(acc.data(), bindings.size()));

  const VkDescriptorSet set = allocate_set(p.set_layout);
  std::array<VkDescriptorBufferInfo, max_bindings> infos;
  std::array<VkWriteDescriptorSet, max_bindings> writes;
  for (std::uint32_t i = 0; i < bindings.size(); ++i) {
    infos[i] = {bindings[i].buffer, bindings[i].offset, bindings[i].range};
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstSet = set;
    writes[i].dstBinding = i;
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  vkUpdateDescriptorSets(dev_->handle(), static_cast<std::uint32_t>(bindings.size()), writes.data(), 0, nullptr);

  VkCommandBuffer cmd = frames_[current_].cmd;
  vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p.handle);
  vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1, &set, 0, nullptr);
  if (push_bytes) {
    // Push the full reserved range so every byte a shader may read is defined.
    std::array<std::byte, push_constant_bytes> data{};
    std::memcpy(data.data(), push, push_bytes);
    vkCmdPushConstants(cmd, p.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_constant_bytes, data.data());
  }
  vkCmdDispatch(cmd, gx, gy, gz);
  ++stats_.n_dispatches;
  if (n_commands_ >= batch_limit_) flush(false);
}

void stream::copy(const binding& src, const binding& dst) {
  const VkDeviceSize bytes = src.range;
  CLEAVE_ASSERT(dst.range == bytes, "copy: sizes differ");
  if (bytes == 0) return;
  const std::array<access, 2> acc = {src.touched, dst.touched};
  before_command(acc);
  VkBufferCopy region{src.offset, dst.offset, bytes};
  vkCmdCopyBuffer(frames_[current_].cmd, src.buffer, dst.buffer, 1, &region);
  ++stats_.n_copies;
  if (n_commands_ >= batch_limit_) flush(false);
}

void stream::flush(bool wait) {
  if (recording_) {
    frame& f = frames_[current_];
    // Make the batch's writes visible to the host (downloads from mapped memory).
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(f.cmd, work_stages, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
    CLEAVE_CHECK_VK(vkEndCommandBuffer(f.cmd));
    VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &f.cmd;
    recording_ = false;
    since_barrier_.clear();
    batch_.clear();
    dev_->submit(submit, f.fence);
    f.in_flight = true;
    ++stats_.n_submits;
    current_ = (current_ + 1) % n_frames;
  }
  if (wait) wait_in_flight();
}

void stream::wait_in_flight() {
  // Oldest first: in ring order from current_, frames were submitted earliest.
  for (std::size_t i = 0; i < n_frames; ++i) wait_frame(frames_[(current_ + i) % n_frames]);
}

}  // namespace cleave::backend::vk
