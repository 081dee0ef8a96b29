// The cuda backend on a GPU: what the shared conformance suite does not cover (memory reuse,
// stream ordering, staging of large transfers, TF32 off by default, plan caching, ties and edge
// cases) and layer shapes of LeNet-5 and a small ResNet at training batch sizes, all against
// the reference backend. Exits 77 (skipped) when no GPU is usable.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "../support/backend_harness.h"
#include "cleave/core/error.h"
#include "cuda_backend.h"

namespace {

using namespace cleave;
using backend::detail::cuda_backend;
using core::shape;
using core::tensor;
using testing::make;
using testing::random_vec;
using testing::read;

core::backend& gpu() {
  static auto b = backend::make_backend("cuda");
  return *b;
}
cuda_backend& gpu_cuda() {
  return dynamic_cast<cuda_backend&>(gpu());
}
core::backend& cpu() {
  static auto b = backend::make_backend("reference");
  return *b;
}

using outs_t = std::vector<std::vector<float>>;

template <class F>
void compare(const char* what, F body, float rtol = 1e-3f, float atol = 1e-4f) {
  const outs_t want = body(cpu());
  const outs_t got = body(gpu());
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    CLEAVE_CHECK_CLOSE(got[i], want[i], rtol, atol, what << " output " << i);
}

}  // namespace

TEST_CASE("the cuda backend names its device and keeps its memory off the host") {
  CHECK(gpu().name() == "cuda");
  CHECK(!gpu().host_memory());
  CHECK(gpu().device_name().find("sm_") != std::string::npos);
  CHECK(!gpu_cuda().tf32());
}

TEST_CASE("views at byte offsets of one buffer upload and download independently") {
  auto& b = gpu();
  auto buf = b.allocate(1000 * sizeof(float));
  tensor whole(buf, 0, shape{1000}, core::dtype::f32);
  tensor a = whole.view(64 * sizeof(float), shape{10, 10}, core::dtype::f32);
  tensor c = whole.view(500 * sizeof(float), shape{100}, core::dtype::f32);
  b.fill(whole, -1.0f);
  const auto va = random_vec(100, 1), vc = random_vec(100, 2);
  b.upload(a, va.data());
  b.upload(c, vc.data());
  b.scale(c, 2.0f);
  const auto all = read(b, whole);
  for (std::size_t i = 0; i < 1000; ++i) {
    const float want = i >= 64 && i < 164 ? va[i - 64] : (i >= 500 && i < 600 ? 2.0f * vc[i - 500] : -1.0f);
    if (all[i] != want) {
      CAPTURE(i);
      FAIL("wrong value in the shared buffer");
    }
  }
}

TEST_CASE("transfers larger than the pinned staging chunks round-trip intact") {
  auto& b = gpu();
  const std::int64_t n = (40 << 20) / 4 + 12345;  // ~40 MiB, not a multiple of the chunk
  const auto v = random_vec(n, 3);
  tensor t = make(b, {n}, v);
  CHECK(read(b, t) == v);
  // Two uploads in a row reuse the staging slots; the first must have landed intact.
  const auto w = random_vec(n, 4);
  tensor u = make(b, {n}, w);
  CHECK(read(b, t) == v);
  CHECK(read(b, u) == w);
}

TEST_CASE("freed tensors are reused by the caching allocator without new device allocations") {
  auto& b = gpu_cuda();
  for (int i = 0; i < 3; ++i) {
    tensor t = b.empty({1000, 37}), u = b.empty({77});
    b.fill(t, 1.0f);
  }
  const auto before = b.memory_stats();
  for (int i = 0; i < 50; ++i) {
    tensor t = b.empty({1000, 37}), u = b.empty({77});
    b.fill(t, static_cast<float>(i));
  }
  const auto after = b.memory_stats();
  CHECK(after.n_device_allocs == before.n_device_allocs);
  CHECK(after.bytes_in_use == before.bytes_in_use);
}

TEST_CASE("queued work stays ordered when its temporaries are freed and reused at once") {
  // Each step's input tensor dies right after the op is queued; its block is handed to the
  // next step's allocation while the GPU may still be working. Results must not mix.
  auto& b = gpu();
  const std::int64_t n = 1 << 20;
  const auto v0 = random_vec(n, 5);
  std::vector<float> want = v0;
  tensor acc = make(b, {n}, v0);
  for (int step = 0; step < 20; ++step) {
    const auto v = random_vec(n, 100 + static_cast<std::uint64_t>(step));
    {
      tensor tmp = make(b, {n}, v);
      tensor prod = b.empty({n});
      b.mul(tmp, acc, prod);
      b.axpy(0.5f, prod, acc);
    }
    for (std::int64_t i = 0; i < n; ++i) want[i] += 0.5f * (v[i] * want[i]);
  }
  CLEAVE_CHECK_CLOSE(read(b, acc), want, 1e-6f, 1e-7f, "ordered chain");
}

TEST_CASE("without TF32 products keep full f32 precision") {
  // 1 + 2^-12 is not representable in TF32 (10-bit mantissa): a TF32 product would give 1.
  const float v = 1.0f + 1.0f / 4096.0f;
  auto& b = gpu();
  const std::int64_t k = 64;
  tensor a = b.empty({128, k}), w = b.empty({k, 128}), c = b.empty({128, 128});
  b.fill(a, v);
  b.fill(w, 1.0f / static_cast<float>(k));
  b.matmul(a, w, c, false, false, 1.0f, 0.0f);
  for (float x : read(b, c)) REQUIRE(std::fabs(x - v) < 1e-6f);
  // 1x1 convolution over 64 channels: the same sum through cuDNN.
  tensor x = b.empty({8, k, 16, 16}), f = b.empty({32, k, 1, 1}), y = b.empty({8, 32, 16, 16});
  b.fill(x, v);
  b.fill(f, 1.0f / static_cast<float>(k));
  b.conv2d_forward({}, x, f, tensor{}, y);
  for (float z : read(b, y)) REQUIRE(std::fabs(z - v) < 1e-6f);
}

TEST_CASE("TF32 is allowed by the device spec and still computes the product") {
  auto t = backend::make_backend("cuda:0:tf32");
  CHECK(dynamic_cast<cuda_backend&>(*t).tf32());
  CHECK(t->device_name().find("tf32") != std::string::npos);
  const std::int64_t m = 256, n = 192, k = 320;
  const auto va = random_vec(m * k, 6), vb = random_vec(k * n, 7);
  tensor a = make(*t, {m, k}, va), bb = make(*t, {k, n}, vb), c = t->empty({m, n});
  t->matmul(a, bb, c, false, false, 1.0f, 0.0f);
  tensor ra = make(cpu(), {m, k}, va), rb = make(cpu(), {k, n}, vb), rc = cpu().empty({m, n});
  cpu().matmul(ra, rb, rc, false, false, 1.0f, 0.0f);
  CLEAVE_CHECK_CLOSE(read(*t, c), read(cpu(), rc), 2e-2f, 2e-2f, "tf32 matmul");
}

TEST_CASE("a bad device index is refused with a message naming the range") {
  std::string what;
  try {
    backend::make_backend("cuda:999");
  } catch (const core::error& e) {
    what = e.what();
  }
  CHECK(what.find("out of range") != std::string::npos);
}

TEST_CASE("convolution plans are made once per shape") {
  auto& b = gpu_cuda();
  const std::size_t before = b.n_conv_plans();
  const core::conv2d_desc d{1, 1, 1, 1};
  tensor x = b.zeros({2, 3, 11, 13}), w = b.zeros({4, 3, 3, 3}), y = b.empty({2, 4, 11, 13});
  for (int i = 0; i < 3; ++i) b.conv2d_forward(d, x, w, tensor{}, y);
  tensor dx = b.empty({2, 3, 11, 13}), dw = b.zeros({4, 3, 3, 3});
  b.conv2d_backward_data(d, y, w, dx);
  b.conv2d_backward_weights(d, x, y, dw, tensor{});
  CHECK(b.n_conv_plans() == before + 1);
  tensor x2 = b.zeros({3, 3, 11, 13}), y2 = b.empty({3, 4, 11, 13});
  b.conv2d_forward(d, x2, w, tensor{}, y2);
  CHECK(b.n_conv_plans() == before + 2);
}

TEST_CASE("max pooling sends the gradient of tied windows to their first element") {
  const core::pool2d_desc d{core::pool_kind::max, 3, 3, 2, 2, 1, 1};
  const shape sx{2, 3, 9, 9}, sy{2, 3, 5, 5};
  std::vector<float> vx(static_cast<std::size_t>(sx.numel()));
  for (std::size_t i = 0; i < vx.size(); ++i) vx[i] = static_cast<float>((i / 7) % 3);  // many ties
  const auto vdy = random_vec(sy.numel(), 8);
  compare(
      "tied max pool",
      [&](core::backend& b) {
        tensor x = make(b, sx, vx), y = b.empty(sy), dy = make(b, sy, vdy), dx = b.empty(sx), ws;
        b.pool2d_forward(d, x, y, &ws);
        b.pool2d_backward(d, x, dy, ws, dx);
        const auto idx = testing::read_typed<std::int32_t>(b, ws);
        return outs_t{read(b, y), read(b, dx), std::vector<float>(idx.begin(), idx.end())};
      },
      0.0f, 0.0f);
}

TEST_CASE("dropout masks of a million elements equal the reference bit for bit") {
  const std::int64_t n = 1 << 20;
  const auto vx = random_vec(n, 9);
  for (float p : {0.2f, 0.5f})
    compare(
        "dropout",
        [&](core::backend& b) {
          tensor x = make(b, {n}, vx), y = b.empty({n}), mask = b.empty({n});
          b.dropout_forward(x, y, mask, p, 0xdeadbeefu);
          return outs_t{read(b, y), read(b, mask)};
        },
        0.0f, 0.0f);
}

TEST_CASE("SGD and AdamW steps equal the reference bit for bit") {
  const std::int64_t n = 100003;
  const auto vp = random_vec(n, 10);
  compare(
      "optimizers",
      [&](core::backend& b) {
        tensor p1 = make(b, {n}, vp), p2 = make(b, {n}, vp), buf = b.zeros({n}), m = b.zeros({n}), v = b.zeros({n});
        for (int step = 1; step <= 3; ++step) {
          tensor g = make(b, {n}, random_vec(n, 30 + static_cast<std::uint64_t>(step)));
          b.sgd_update({0.05f, 0.9f, 1e-4f, true}, p1, g, buf);
          b.adamw_update({1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, step}, p2, g, m, v);
        }
        return outs_t{read(b, p1), read(b, buf), read(b, p2), read(b, m), read(b, v)};
      },
      0.0f, 0.0f);
}

TEST_CASE("casts of a large tensor equal the reference bit for bit") {
  const std::int64_t n = 300001;
  const auto v = random_vec(n, 11, -70000.0f, 70000.0f);
  for (auto to : {core::dtype::f16, core::dtype::bf16, core::dtype::i8, core::dtype::u8, core::dtype::i32}) {
    CAPTURE(core::dtype_name(to));
    compare(
        "cast",
        [&](core::backend& b) {
          tensor x = make(b, {n}, v), y = b.empty({n}, to), back = b.empty({n});
          b.cast(x, y);
          b.cast(y, back);
          return outs_t{read(b, back)};
        },
        0.0f, 0.0f);
  }
}

TEST_CASE("batch norm over one value per channel keeps the biased variance in running_var") {
  compare("batchnorm n=1", [&](core::backend& b) {
    const shape s{1, 5};
    tensor x = make(b, s, random_vec(5, 12)), g = make(b, {5}, random_vec(5, 13)), be = make(b, {5}, random_vec(5, 14)),
           y = b.empty(s), mean = b.empty({5}), invstd = b.empty({5}), rm = make(b, {5}, random_vec(5, 15)),
           rv = make(b, {5}, random_vec(5, 16, 0.5f, 1.5f));
    b.batchnorm_forward_train({}, x, g, be, y, mean, invstd, rm, rv);
    return outs_t{read(b, y), read(b, mean), read(b, invstd), read(b, rm), read(b, rv)};
  });
}

TEST_CASE("softmax cross-entropy over many classes matches the reference") {
  const std::int64_t n = 300, k = 1000;
  const auto vl = random_vec(n * k, 17, -20.0f, 20.0f);
  std::vector<std::int32_t> labels(n);
  for (std::int64_t i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 37) % k);
  compare("softmax_xent", [&](core::backend& b) {
    tensor logits = make(b, {n, k}, vl), lab = testing::make_typed(b, {n}, core::dtype::i32, labels),
           probs = b.empty({n, k}), loss = b.empty({1}), dl = b.empty({n, k});
    b.softmax_xent_forward(logits, lab, probs, loss);
    b.softmax_xent_backward(probs, lab, dl, 1.0f);
    return outs_t{read(b, probs), read(b, loss), read(b, dl)};
  });
}

TEST_CASE("large matmuls of every transpose match the reference") {
  const std::int64_t m = 257, n = 513, k = 1023;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const shape sa = ta ? shape{k, m} : shape{m, k}, sb = tb ? shape{n, k} : shape{k, n};
      const auto va = random_vec(sa.numel(), 18), vb = random_vec(sb.numel(), 19), vc = random_vec(m * n, 20);
      compare("matmul", [&](core::backend& b) {
        tensor a = make(b, sa, va), bb = make(b, sb, vb), c = make(b, {m, n}, vc);
        b.matmul(a, bb, c, ta, tb, 0.75f, -1.5f);
        return outs_t{read(b, c)};
      });
    }
}

TEST_CASE("LeNet-5 layers at batch 64 match the reference forward and backward") {
  const std::int64_t n = 64;
  const core::pool2d_desc pool{core::pool_kind::max, 2, 2, 2, 2, 0, 0};
  const auto vx = random_vec(n * 28 * 28, 21), w1 = random_vec(6 * 25, 22, -0.3f, 0.3f), b1 = random_vec(6, 23),
             w2 = random_vec(16 * 6 * 25, 24, -0.1f, 0.1f), b2 = random_vec(16, 25),
             w3 = random_vec(120 * 400, 26, -0.05f, 0.05f), b3 = random_vec(120, 27),
             w4 = random_vec(10 * 120, 28, -0.1f, 0.1f), b4 = random_vec(10, 29);
  std::vector<std::int32_t> labels(n);
  for (std::int64_t i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i % 10);
  compare("lenet", [&](core::backend& b) {
    tensor x = make(b, {n, 1, 28, 28}, vx), cw1 = make(b, {6, 1, 5, 5}, w1), cb1 = make(b, {6}, b1),
           cw2 = make(b, {16, 6, 5, 5}, w2), cb2 = make(b, {16}, b2), fw3 = make(b, {120, 400}, w3),
           fb3 = make(b, {120}, b3), fw4 = make(b, {10, 120}, w4), fb4 = make(b, {10}, b4),
           lab = testing::make_typed(b, {n}, core::dtype::i32, labels);
    tensor a1 = b.empty({n, 6, 28, 28}), p1 = b.empty({n, 6, 14, 14}), a2 = b.empty({n, 16, 10, 10}),
           p2 = b.empty({n, 16, 5, 5}), a3 = b.empty({n, 120}), a4 = b.empty({n, 10}), probs = b.empty({n, 10}),
           loss = b.empty({1}), ws1, ws2;
    b.conv2d_forward({1, 1, 2, 2}, x, cw1, cb1, a1);
    b.relu_forward(a1, a1);
    b.pool2d_forward(pool, a1, p1, &ws1);
    b.conv2d_forward({}, p1, cw2, cb2, a2);
    b.relu_forward(a2, a2);
    b.pool2d_forward(pool, a2, p2, &ws2);
    b.linear_forward(p2.reshaped({n, 400}), fw3, fb3, a3);
    b.relu_forward(a3, a3);
    b.linear_forward(a3, fw4, fb4, a4);
    b.softmax_xent_forward(a4, lab, probs, loss);
    // backward
    tensor d4 = b.empty({n, 10}), d3 = b.empty({n, 120}), dp2 = b.empty({n, 16, 5, 5}), da2 = b.empty({n, 16, 10, 10}),
           dp1 = b.empty({n, 6, 14, 14}), da1 = b.empty({n, 6, 28, 28});
    tensor gw4 = b.zeros({10, 120}), gb4 = b.zeros({10}), gw3 = b.zeros({120, 400}), gb3 = b.zeros({120}),
           gw2 = b.zeros({16, 6, 5, 5}), gb2 = b.zeros({16}), gw1 = b.zeros({6, 1, 5, 5}), gb1 = b.zeros({6});
    b.softmax_xent_backward(probs, lab, d4, 1.0f);
    b.linear_backward_weights(a3, d4, gw4, gb4);
    b.linear_backward_data(d4, fw4, d3);
    b.relu_backward(a3, d3, d3);
    b.linear_backward_weights(p2.reshaped({n, 400}), d3, gw3, gb3);
    b.linear_backward_data(d3, fw3, dp2.reshaped({n, 400}));
    b.pool2d_backward(pool, a2, dp2, ws2, da2);
    b.relu_backward(a2, da2, da2);
    b.conv2d_backward_weights({}, p1, da2, gw2, gb2);
    b.conv2d_backward_data({}, da2, cw2, dp1);
    b.pool2d_backward(pool, a1, dp1, ws1, da1);
    b.relu_backward(a1, da1, da1);
    b.conv2d_backward_weights({1, 1, 2, 2}, x, da1, gw1, gb1);
    return outs_t{read(b, loss), read(b, probs), read(b, gw4), read(b, gb4), read(b, gw3), read(b, gb3),
                  read(b, gw2),  read(b, gb2),   read(b, gw1), read(b, gb1), read(b, da1)};
  });
}

TEST_CASE("ResNet basic-block layers match the reference forward and backward") {
  const std::int64_t n = 8, c = 16, h = 32;
  const core::conv2d_desc same{1, 1, 1, 1}, down{2, 2, 1, 1}, proj{2, 2, 0, 0};
  const auto vx = random_vec(n * c * h * h, 31), vw1 = random_vec(2 * c * c * 9, 32, -0.2f, 0.2f),
             vw2 = random_vec(2 * c * 2 * c * 9, 33, -0.1f, 0.1f), vws = random_vec(2 * c * c, 34, -0.3f, 0.3f),
             vg = random_vec(2 * c, 35, 0.5f, 1.5f), vb = random_vec(2 * c, 36),
             vdy = random_vec(n * 2 * c * (h / 2) * (h / 2), 37);
  compare("resnet block", [&](core::backend& b) {
    const shape sx{n, c, h, h}, sy{n, 2 * c, h / 2, h / 2};
    tensor x = make(b, sx, vx), w1 = make(b, {2 * c, c, 3, 3}, vw1), w2 = make(b, {2 * c, 2 * c, 3, 3}, vw2),
           ws = make(b, {2 * c, c, 1, 1}, vws), g = make(b, {2 * c}, vg), be = make(b, {2 * c}, vb),
           dy = make(b, sy, vdy);
    tensor a1 = b.empty(sy), n1 = b.empty(sy), a2 = b.empty(sy), sc = b.empty(sy), out = b.empty(sy),
           mean = b.empty({2 * c}), invstd = b.empty({2 * c}), rm = b.zeros({2 * c}), rv = b.zeros({2 * c});
    b.fill(rv, 1.0f);
    b.conv2d_forward(down, x, w1, tensor{}, a1);
    b.batchnorm_forward_train({}, a1, g, be, n1, mean, invstd, rm, rv);
    b.relu_forward(n1, n1);
    b.conv2d_forward(same, n1, w2, tensor{}, a2);
    b.conv2d_forward(proj, x, ws, tensor{}, sc);
    b.add(a2, sc, out);
    // backward through both branches
    tensor dn1 = b.empty(sy), da1 = b.empty(sy), dx = b.empty(sx), dx_sc = b.empty(sx), gw1 = b.zeros({2 * c, c, 3, 3}),
           gw2 = b.zeros({2 * c, 2 * c, 3, 3}), gws = b.zeros({2 * c, c, 1, 1}), dg = b.zeros({2 * c}),
           db = b.zeros({2 * c});
    b.conv2d_backward_weights(same, n1, dy, gw2, tensor{});
    b.conv2d_backward_data(same, dy, w2, dn1);
    b.relu_backward(n1, dn1, dn1);
    b.batchnorm_backward({}, a1, dn1, g, mean, invstd, da1, dg, db);
    b.conv2d_backward_weights(down, x, da1, gw1, tensor{});
    b.conv2d_backward_data(down, da1, w1, dx);
    b.conv2d_backward_weights(proj, x, dy, gws, tensor{});
    b.conv2d_backward_data(proj, dy, ws, dx_sc);
    b.add(dx, dx_sc, dx);
    return outs_t{read(b, out), read(b, rm), read(b, rv), read(b, gw2), read(b, gw1),
                  read(b, gws), read(b, dg), read(b, db), read(b, dx)};
  });
}

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list", 6) == 0 || std::strncmp(argv[i], "-l", 2) == 0) listing = true;
  if (!listing) {
    for (const auto& b : cleave::backend::list_backends())
      if (b.name == "cuda" && !b.available) {
        std::printf("cuda: no usable GPU, skipping: %s\n", b.detail.c_str());
        return 77;
      }
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
