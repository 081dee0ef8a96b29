// Behaviour specific to the vulkan backend: device selection, the memory pool, command
// batching and ordering, large and empty buffers, sharing a device, and error reporting.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <thread>

#include "vk_check.h"
#include "vk_test_util.h"

namespace cleave::test {

namespace vk = backend::vk;

namespace {

const vk::memory_pool::allocation& alloc_of(const tensor& t) {
  return static_cast<const vk::vk_buffer*>(t.buf())->alloc();
}

bool overlaps(const vk::memory_pool::allocation& a, const vk::memory_pool::allocation& b) {
  return a.blk == b.blk && a.offset < b.offset + b.size && b.offset < a.offset + a.size;
}

tensor upload_values(core::backend& b, const shape& s, const std::vector<float>& v) {
  tensor t = b.empty(s);
  b.upload(t, v.data());
  return t;
}

}  // namespace

TEST_CASE("the registry lists vulkan with its device, and auto prefers only real GPUs") {
  require_vulkan();
  no_validation_messages guard;
  const auto all = backend::list_backends();
  const auto it = std::find_if(all.begin(), all.end(), [](const auto& b) { return b.name == "vulkan"; });
  REQUIRE(it != all.end());
  CHECK(it->available);
  const auto inst = vk::instance::get();
  const auto& preferred = vk::select_device(inst->devices(), "");
  CHECK(it->detail.find(preferred.name) != std::string::npos);
  CHECK(it->real_gpu == vk::is_real_gpu(preferred.type));
  if (!vk::is_real_gpu(preferred.type)) CHECK(backend::resolve_auto() != "vulkan");
}

TEST_CASE("the preferred device is a discrete GPU, then an integrated one, then the rest") {
  using pd = vk::physical_device;
  std::vector<pd> devs = {pd{VK_NULL_HANDLE, 0, "llvmpipe", VK_PHYSICAL_DEVICE_TYPE_CPU, 0},
                          pd{VK_NULL_HANDLE, 1, "Intel UHD", VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU, 0},
                          pd{VK_NULL_HANDLE, 2, "NVIDIA H200", VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU, 0},
                          pd{VK_NULL_HANDLE, 3, "virtio", VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU, 0}};
  CHECK(vk::select_device(devs, "").index == 2);
  devs.erase(devs.begin() + 2);
  CHECK(vk::select_device(devs, "").index == 1);
  devs.erase(devs.begin() + 1);
  CHECK(vk::select_device(devs, "").index == 3);
  devs.pop_back();
  CHECK(vk::select_device(devs, "").index == 0);
}

TEST_CASE("devices are chosen by index or by a case-insensitive name substring") {
  using pd = vk::physical_device;
  const std::vector<pd> devs = {
      pd{VK_NULL_HANDLE, 0, "llvmpipe (LLVM 15.0.6, 256 bits)", VK_PHYSICAL_DEVICE_TYPE_CPU, 0},
      pd{VK_NULL_HANDLE, 1, "NVIDIA H200", VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU, 0}};
  CHECK(vk::select_device(devs, "0").index == 0);
  CHECK(vk::select_device(devs, "1").index == 1);
  CHECK(vk::select_device(devs, "nvidia").index == 1);
  CHECK(vk::select_device(devs, "LLVM").index == 0);
  CHECK_THROWS_WITH_AS(vk::select_device(devs, "7"), doctest::Contains("no device with index 7"), core::error);
  CHECK_THROWS_WITH_AS(vk::select_device(devs, "radeon"),
                       doctest::Contains("no device whose name contains 'radeon' (devices: 0: llvmpipe"), core::error);
  CHECK_THROWS_WITH_AS(vk::select_device({}, ""), doctest::Contains("no device"), core::error);
}

TEST_CASE("make_backend selects the real devices by index and name") {
  require_vulkan();
  no_validation_messages guard;
  const auto inst = vk::instance::get();
  const auto& devs = inst->devices();
  REQUIRE(!devs.empty());
  const auto& d0 = devs.front();
  auto by_index = backend::make_backend("vulkan:" + std::to_string(d0.index));
  CHECK(by_index->name() == "vulkan");
  CHECK(by_index->device_name().find(d0.name) == 0);
  std::string part = d0.name.substr(0, std::min<std::size_t>(4, d0.name.size()));
  for (auto& ch : part) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  auto by_name = backend::make_backend("vulkan:" + part);
  CHECK(by_name->device_name().find(d0.name) == 0);
  CHECK_THROWS_WITH_AS(backend::make_backend("vulkan:4242"), doctest::Contains("no device with index 4242"),
                       core::error);
  CHECK_THROWS_WITH_AS(backend::make_backend("vulkan:no-such-gpu"),
                       doctest::Contains("no device whose name contains 'no-such-gpu'"), core::error);
}

TEST_CASE("the validation layer is on in these tests when it is installed") {
  require_vulkan();
  std::uint32_t n = 0;
  vkEnumerateInstanceLayerProperties(&n, nullptr);
  std::vector<VkLayerProperties> layers(n);
  vkEnumerateInstanceLayerProperties(&n, layers.data());
  const bool installed = std::any_of(layers.begin(), layers.end(), [](const auto& l) {
    return std::string(l.layerName) == "VK_LAYER_KHRONOS_validation";
  });
  auto b = make_vulkan();
  CHECK(vk::instance::get()->validation() == installed);
  if (!installed) MESSAGE("VK_LAYER_KHRONOS_validation is not installed: API usage is not validated");
}

TEST_CASE("validation-layer messages are counted") {
  auto b = make_vulkan();
  if (!vk::instance::get()->validation()) return;
  const auto before = vk::validation_message_count();
  // A buffer of size 0 is invalid usage that drivers tolerate: the layer must report it.
  VkBufferCreateInfo info{};
  info.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
  info.size = 0;
  info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
  VkBuffer buf = VK_NULL_HANDLE;
  if (vkCreateBuffer(b->vk_device().handle(), &info, nullptr, &buf) == VK_SUCCESS)
    vkDestroyBuffer(b->vk_device().handle(), buf, nullptr);
  CHECK(vk::validation_message_count() > before);
}

TEST_CASE("released memory is reused without new device allocations") {
  auto b = make_vulkan();
  no_validation_messages guard;
  {
    tensor warm = b->empty({1000});  // the first block exists from here on
    b->fill(warm, 0.0f);
  }
  b->synchronize();
  const auto before = b->pool_stats();
  for (int i = 0; i < 200; ++i) {
    tensor t = b->empty({1000 + i});
    b->fill(t, static_cast<float>(i));
    if (i % 50 == 0) CHECK(fetch<float>(*b, t)[0] == static_cast<float>(i));
  }
  b->synchronize();
  const auto after = b->pool_stats();
  CHECK(after.n_device_allocations == before.n_device_allocations);
  CHECK(after.n_live == before.n_live);
  CHECK(after.used_bytes == before.used_bytes);
}

TEST_CASE("memory released while recorded work may use it is reused only after that work") {
  auto b = make_vulkan();
  no_validation_messages guard;
  b->synchronize();
  tensor a = b->empty({1024});
  b->fill(a, 1.0f);  // recorded, not yet submitted
  const auto range_a = alloc_of(a);
  a = tensor{};
  tensor c = b->empty({1024});
  CHECK_FALSE(overlaps(alloc_of(c), range_a));
  b->synchronize();
  tensor d = b->empty({1024});
  CHECK(overlaps(alloc_of(d), range_a));  // first fit finds the range again once it is safe
}

TEST_CASE("a chain of dependent ops is recorded into one submit with barriers between") {
  auto b = make_vulkan();
  no_validation_messages guard;
  tensor x = upload_values(*b, {513}, std::vector<float>(513, 1.0f));
  tensor one = upload_values(*b, {513}, std::vector<float>(513, 1.0f));
  b->synchronize();
  const auto s0 = b->stream_stats();
  for (int i = 0; i < 300; ++i) b->axpy(0.5f, one, x);
  const auto y = fetch<float>(*b, x);
  const auto s1 = b->stream_stats();
  CHECK(s1.n_submits - s0.n_submits == 1);
  CHECK(s1.n_barriers - s0.n_barriers >= 299);
  for (float v : y) REQUIRE(v == 151.0f);
}

TEST_CASE("independent ops share a barrier-free stretch of the batch") {
  auto b = make_vulkan();
  no_validation_messages guard;
  std::vector<tensor> ts;
  for (int i = 0; i < 8; ++i) ts.push_back(b->empty({100}));
  b->synchronize();
  const auto s0 = b->stream_stats();
  for (int i = 0; i < 8; ++i) b->fill(ts[static_cast<std::size_t>(i)], static_cast<float>(i));
  CHECK(b->stream_stats().n_barriers == s0.n_barriers);
  b->add(ts[0], ts[1], ts[2]);  // reads what fills wrote: one barrier
  CHECK(b->stream_stats().n_barriers == s0.n_barriers + 1);
  CHECK(fetch<float>(*b, ts[2])[99] == 1.0f);
}

TEST_CASE("a batch is submitted once it reaches the limit, and results stay right") {
  auto b = make_vulkan();
  no_validation_messages guard;
  b->set_batch_limit(8);
  tensor x = upload_values(*b, {1000}, std::vector<float>(1000, 0.0f));
  tensor one = upload_values(*b, {1000}, std::vector<float>(1000, 1.0f));
  b->synchronize();
  const auto s0 = b->stream_stats();
  for (int i = 0; i < 50; ++i) b->axpy(1.0f, one, x);
  CHECK(b->stream_stats().n_submits - s0.n_submits >= 6);
  for (float v : fetch<float>(*b, x)) REQUIRE(v == 50.0f);
}

TEST_CASE("an upload is ordered after the recorded ops that read the old contents") {
  auto b = make_vulkan();
  no_validation_messages guard;
  const std::vector<float> first(300, 3.0f), second(300, 5.0f);
  tensor x = upload_values(*b, {300}, first);
  tensor two = upload_values(*b, {300}, std::vector<float>(300, 2.0f));
  tensor y = b->empty({300}), z = b->empty({300});
  b->mul(x, two, y);
  b->upload(x, second.data());  // must not overwrite x before the mul runs
  b->mul(x, two, z);
  CHECK(fetch<float>(*b, y) == std::vector<float>(300, 6.0f));
  CHECK(fetch<float>(*b, z) == std::vector<float>(300, 10.0f));
}

TEST_CASE("downloading a tensor the batch does not write needs no submit where memory is mapped") {
  auto b = make_vulkan();
  no_validation_messages guard;
  tensor untouched = upload_values(*b, {64}, std::vector<float>(64, 7.0f));
  tensor busy = b->empty({64});
  b->synchronize();
  const auto s0 = b->stream_stats();
  b->fill(busy, 1.0f);
  CHECK(fetch<float>(*b, untouched)[63] == 7.0f);
  if (b->direct_transfers()) CHECK(b->stream_stats().n_submits == s0.n_submits);
  CHECK(fetch<float>(*b, busy)[63] == 1.0f);
  if (b->direct_transfers()) CHECK(b->stream_stats().n_submits == s0.n_submits + 1);
}

TEST_CASE("transfers through staging memory, as on discrete GPUs, keep their order and values") {
  require_vulkan();
  setenv("CLEAVE_VK_STAGING", "1", 1);
  auto b = make_vulkan();
  unsetenv("CLEAVE_VK_STAGING");
  no_validation_messages guard;
  CHECK_FALSE(b->direct_transfers());
  const auto v1 = random_values(4099, 1), v2 = random_values(4099, 2);
  tensor x = upload_values(*b, {4099}, v1);
  tensor y = b->empty({4099});
  b->scale(x, 2.0f);
  b->copy(x, y);
  b->upload(x, v2.data());
  b->axpy(1.0f, y, x);
  const auto got_x = fetch<float>(*b, x), got_y = fetch<float>(*b, y);
  for (std::size_t i = 0; i < v1.size(); ++i) {
    REQUIRE(got_y[i] == v1[i] * 2.0f);
    REQUIRE(got_x[i] == v2[i] + v1[i] * 2.0f);
  }
  // Odd-sized byte tensors at odd offsets.
  std::vector<std::uint8_t> bytes(37);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(3 * i + 1);
  tensor raw = b->empty({40}, core::dtype::u8);
  tensor mid = raw.view(3, {37}, core::dtype::u8);
  b->upload(mid, bytes.data());
  CHECK(fetch<std::uint8_t>(*b, mid) == bytes);
}

TEST_CASE("a training step's forward and backward is one submit and matches the reference") {
  pair_env e;
  no_validation_messages guard;
  const std::int64_t n = 8;
  const core::conv2d_desc cd{1, 1, 0, 0};
  core::pool2d_desc pd;
  auto x = e.rand({n, 1, 12, 12}), w1 = e.rand({4, 1, 5, 5}, -0.3f, 0.3f), b1 = e.rand({4}, -0.1f, 0.1f);
  auto w2 = e.rand({10, 64}, -0.2f, 0.2f), b2 = e.rand({10}, -0.1f, 0.1f);
  auto labels = e.labels(n, 10);
  auto run = [&](core::backend& be, bool vk, tensor& loss_out) {
    auto T = [vk](const twin& t) { return vk ? t.vk : t.ref; };
    tensor c1 = be.empty({n, 4, 8, 8}), a1 = be.empty({n, 4, 8, 8}), p1 = be.empty({n, 4, 4, 4}), ws;
    tensor logits = be.empty({n, 10}), probs = be.empty({n, 10}), loss = be.empty({1});
    be.conv2d_forward(cd, T(x), T(w1), T(b1), c1);
    be.relu_forward(c1, a1);
    be.pool2d_forward(pd, a1, p1, &ws);
    tensor flat = p1.reshaped({n, 64});
    be.linear_forward(flat, T(w2), T(b2), logits);
    be.softmax_xent_forward(logits, T(labels), probs, loss);
    tensor dlogits = be.empty({n, 10}), dflat = be.empty({n, 64}), da1 = be.empty({n, 4, 8, 8});
    tensor dw1 = be.zeros({4, 1, 5, 5}), db1 = be.zeros({4}), dw2 = be.zeros({10, 64}), db2 = be.zeros({10});
    be.softmax_xent_backward(probs, T(labels), dlogits, 1.0f);
    be.linear_backward_weights(flat, dlogits, dw2, db2);
    be.linear_backward_data(dlogits, T(w2), dflat);
    be.pool2d_backward(pd, a1, dflat.reshaped({n, 4, 4, 4}), ws, da1);
    be.relu_backward(a1, da1, da1);
    be.conv2d_backward_weights(cd, T(x), da1, dw1, db1);
    core::sgd_desc sd{0.1f, 0.0f, 0.0f, false};
    be.sgd_update(sd, T(w1), dw1, {});
    be.sgd_update(sd, T(w2), dw2, {});
    loss_out = loss;
  };
  e.vk->synchronize();
  const auto s0 = e.vk->stream_stats();
  twin loss;
  run(*e.vk, true, loss.vk);
  run(*e.ref, false, loss.ref);
  e.expect_close(loss, 1e-5f, 1e-5f, "loss");
  CHECK(e.vk->stream_stats().n_submits - s0.n_submits == 1);
  e.expect_close(w1, 1e-4f, 1e-5f, "conv weights after one step");
  e.expect_close(w2, 1e-4f, 1e-5f, "linear weights after one step");
}

TEST_CASE("large buffers get their own block, compute correctly and are returned") {
  auto b = make_vulkan();
  no_validation_messages guard;
  b->synchronize();
  const auto before = b->pool_stats();
  {
    const std::int64_t n = 24'000'001;  // ~96 MB: above the 64 MiB pooled blocks
    tensor big = b->empty({n});
    tensor ramp = b->empty({n});
    b->fill(big, 1.5f);
    b->fill(ramp, 2.0f);
    b->axpy(0.25f, ramp, big);
    std::vector<float> host(static_cast<std::size_t>(n));
    b->download(big, host.data());
    CHECK(host.front() == 2.0f);
    CHECK(host[static_cast<std::size_t>(n / 2)] == 2.0f);
    CHECK(host.back() == 2.0f);
    for (std::size_t i = 0; i < host.size(); i += 4099) REQUIRE(host[i] == 2.0f);
    host.assign(host.size(), -1.0f);
    host.back() = 9.0f;
    b->upload(big, host.data());
    std::vector<float> tail(1);
    b->download(big.view(static_cast<std::size_t>(n - 1) * 4, {1}, core::dtype::f32), tail.data());
    CHECK(tail[0] == 9.0f);
  }
  b->synchronize();
  const auto after = b->pool_stats();
  CHECK(after.n_blocks == before.n_blocks);
  CHECK(after.reserved_bytes == before.reserved_bytes);
}

TEST_CASE("a GEMM wider than the workgroup grid allows is walked in chunks") {
  pair_env e;
  no_validation_messages guard;
  // As if the device allowed only 2 workgroups along x: 1000 columns need several chunks.
  e.vk->set_max_workgroups_x(2);
  auto a = e.rand({5, 7}), w = e.rand({7, 1000}), c = e.rand({5, 1000});
  e.vk->matmul(a.vk, w.vk, c.vk, false, false, 1.0f, 0.0f);
  e.ref->matmul(a.ref, w.ref, c.ref, false, false, 1.0f, 0.0f);
  e.expect_close(c, 1e-5f, 1e-5f, "chunked matmul");
  const core::conv2d_desc d{1, 1, 1, 1};
  auto x = e.rand({4, 3, 16, 16}), k = e.rand({4, 3, 3, 3}), y = e.rand({4, 4, 16, 16});
  e.vk->conv2d_forward(d, x.vk, k.vk, {}, y.vk);
  e.ref->conv2d_forward(d, x.ref, k.ref, {}, y.ref);
  e.expect_close(y, 1e-5f, 1e-4f, "chunked conv2d_forward");
}

TEST_CASE("a tensor larger than one binding can address is refused with a clear message") {
  auto b = make_vulkan();
  const auto& lim = b->vk_device().limits();
  const auto too_big = static_cast<std::size_t>(lim.maxStorageBufferRange) + 4096;
  CHECK_THROWS_WITH_AS(b->allocate(too_big), doctest::Contains("exceeds the largest one"), core::error);
}

TEST_CASE("empty tensors are accepted by memory ops and element-wise ops") {
  auto b = make_vulkan();
  no_validation_messages guard;
  tensor t = b->empty({0});
  tensor u = b->empty({0, 3});
  b->upload(t, nullptr);
  b->download(t, nullptr);
  b->fill(t, 1.0f);
  b->copy(u.reshaped({0}), t);
  b->add(t, t, t);
  tensor h = b->empty({0}, core::dtype::f16);
  b->cast(t, h);
  b->synchronize();
}

TEST_CASE("tensors may outlive the backend that made them") {
  tensor keep;
  {
    auto b = make_vulkan();
    keep = b->empty({4096});
    b->fill(keep, 3.0f);
  }
  keep = tensor{};  // the pool and device stay alive until here
}

TEST_CASE("backends on one device share its pipelines and run side by side on two threads") {
  auto a = make_vulkan();
  auto b = make_vulkan();
  no_validation_messages guard;
  CHECK(&a->vk_device() == &b->vk_device());
  auto work = [](vk::vulkan_backend& be, float step, std::vector<float>& out) {
    tensor x = be.zeros({2000});
    tensor s = be.empty({2000});
    be.fill(s, step);
    for (int i = 0; i < 100; ++i) {
      be.axpy(1.0f, s, x);
      if (i % 25 == 0) be.synchronize();
    }
    out = fetch<float>(be, x);
  };
  std::vector<float> ra, rb;
  std::thread ta([&] { work(*a, 1.0f, ra); });
  std::thread tb([&] { work(*b, 2.0f, rb); });
  ta.join();
  tb.join();
  CHECK(ra == std::vector<float>(2000, 100.0f));
  CHECK(rb == std::vector<float>(2000, 200.0f));
  const auto n = a->vk_device().n_pipelines();
  tensor y = a->zeros({10});
  a->axpy(1.0f, y, y);
  a->synchronize();
  CHECK(a->vk_device().n_pipelines() == n);  // both were compiled already
}

TEST_CASE("Vulkan failures become core::error naming the call and the result") {
  const auto fails = [] { CLEAVE_CHECK_VK(VK_ERROR_DEVICE_LOST); };
  CHECK_THROWS_WITH_AS(fails(), doctest::Contains("VK_ERROR_DEVICE_LOST (-4)"), core::error);
  CHECK_THROWS_WITH_AS(fails(), doctest::Contains("vulkan: VK_ERROR_DEVICE_LOST failed"), core::error);
}

}  // namespace cleave::test
