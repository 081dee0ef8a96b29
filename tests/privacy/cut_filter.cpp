// Cut filters: the order in which a chain runs them at each of its three points, when a tensor is
// replaced, and what each of a device's defences does to a tensor and to the gradient coming back.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../support/backend_harness.h"
#include "cleave/core/micro_batch_seed.h"
#include "cleave/core/stage.h"
#include "cleave/privacy/cut_filters.h"

using namespace cleave;
using namespace cleave::privacy;
using core::tensor;

namespace {

// What the filters of a test see: a reference backend, a micro-batch of n rows of d values, its
// inputs and labels.
struct bench {
  std::unique_ptr<core::backend> b = backend::make_backend("reference");
  std::int64_t n = 6, d = 5;
  micro_batch_key key{3, 17, 2};
  std::vector<float> xv = testing::random_vec(n * 8, 1), ov = testing::random_vec(n * d, 2, -2.0f, 2.0f);
  std::vector<std::int32_t> yv = {0, 1, 0, 2, 1, 0};
  tensor x = testing::make(*b, {n, 8}, xv), y = testing::make_typed(*b, {n}, core::dtype::i32, yv);
  tensor o = testing::make(*b, {n, d}, ov);

  departure leaving(int label_groups = 1, std::uint32_t batch_size = 12) {
    return departure(*b, key, x, y, {}, batch_size, label_groups);
  }
  tensor make(const std::vector<float>& v) { return testing::make(*b, {n, d}, v); }
  std::vector<float> read(const tensor& t) { return testing::read(*b, t); }
};

// Records the hooks it sees in a shared log, and adds `add` to every value of what passes.
struct recorder : cut_filter {
  std::string name;
  std::vector<std::string>* log;
  float add;
  recorder(std::string n, std::vector<std::string>* l, float a = 0) : name(std::move(n)), log(l), add(a) {}
  void touch(crossing& c) {
    if (add == 0) return;
    for (float& v : c.edit()) v += add;
  }
  void output(departure&, crossing& o) override {
    log->push_back(name + ".output");
    touch(o);
  }
  void gradient(const micro_batch_key&, crossing& g) override {
    log->push_back(name + ".gradient");
    touch(g);
  }
  void loss_gradient(const micro_batch_key&, crossing& g) override {
    log->push_back(name + ".loss_gradient");
    touch(g);
  }
  void discard(std::uint32_t device) override { log->push_back(name + ".discard " + std::to_string(device)); }
};

double row_norm(const std::vector<float>& v, std::int64_t i, std::int64_t d) {
  double s = 0;
  for (std::int64_t k = 0; k < d; ++k) s += double(v[i * d + k]) * v[i * d + k];
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("a chain runs outputs through its filters in order, their gradients in reverse, loss gradients in order") {
  bench t;
  std::vector<std::string> log;
  filter_chain c;
  c.add(std::make_unique<recorder>("a", &log)).add(std::make_unique<recorder>("b", &log));
  auto d = t.leaving();
  c.output(*t.b, d, t.o);
  c.gradient(*t.b, t.key, t.o);
  c.loss_gradient(*t.b, t.key, t.o);
  c.discard(3);
  CHECK(log == std::vector<std::string>{"a.output", "b.output", "b.gradient", "a.gradient", "a.loss_gradient",
                                        "b.loss_gradient", "a.discard 3", "b.discard 3"});
}

TEST_CASE("a chain hands on the same tensor unless a filter changed it, and a new one with every change if so") {
  bench t;
  std::vector<std::string> log;
  filter_chain quiet;
  quiet.add(std::make_unique<recorder>("q", &log));
  auto d = t.leaving();
  CHECK(quiet.output(*t.b, d, t.o).buf() == t.o.buf());
  CHECK(quiet.loss_gradient(*t.b, t.key, t.o).buf() == t.o.buf());
  CHECK(filter_chain{}.gradient(*t.b, t.key, t.o).buf() == t.o.buf());

  filter_chain two;
  two.add(std::make_unique<recorder>("a", &log, 1.0f)).add(std::make_unique<recorder>("b", &log, 0.5f));
  const tensor out = two.output(*t.b, d, t.o);
  CHECK(out.buf() != t.o.buf());  // the segment may keep its output for the backward pass
  CHECK(t.read(t.o) == t.ov);
  const auto got = t.read(out);
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == t.ov[i] + 1.0f + 0.5f);
}

TEST_CASE("an output or loss gradient of no rows passes every filter untouched") {
  bench t;
  std::vector<std::string> log;
  filter_chain c;
  c.add(std::make_unique<recorder>("a", &log, 1.0f));
  const tensor none = t.b->empty({0, t.d});
  auto d = t.leaving();
  CHECK(c.output(*t.b, d, none).buf() == none.buf());
  CHECK(c.loss_gradient(*t.b, t.key, none).buf() == none.buf());
  CHECK(log.empty());
}

TEST_CASE(
    "the clip filter bounds each row, draws its noise from the micro-batch's stream and clips the gradient back") {
  bench t;
  const double clip = 1.0, noise = 0.3;
  std::vector<float> clipped = t.ov;
  const auto scale = clip_rows(clipped, t.n, clip);
  REQUIRE(std::count_if(scale.begin(), scale.end(), [](float s) { return s < 1; }) > 0);

  SUBCASE("without noise the output is clipped exactly") {
    filter_chain c;
    c.add(std::make_unique<clip_filter>(clip, 0.0, 99));
    auto d = t.leaving();
    CHECK(t.read(c.output(*t.b, d, t.o)) == clipped);
    // The gradient goes back through the clipping.
    const auto g = testing::random_vec(t.n * t.d, 3);
    std::vector<float> want = g;
    clip_rows_backward(want, clipped, scale, t.n, clip);
    CHECK(t.read(c.gradient(*t.b, t.key, t.make(g))) == want);
    // Once: a second gradient of that micro-batch passes as it is.
    CHECK(t.read(c.gradient(*t.b, t.key, t.make(g))) == g);
  }
  SUBCASE("with noise: std noise * clip around the clipped rows, repeatable, and the gradient goes around it") {
    std::vector<float> want = clipped;
    core::rng r(
        core::micro_batch_seed(99, t.key.device, t.key.step, t.key.micro_batch, core::stream::activation_noise));
    for (float& v : want) v += static_cast<float>(noise * clip * r.normal());
    filter_chain c;
    c.add(std::make_unique<clip_filter>(clip, noise, 99));
    auto d = t.leaving();
    CHECK(t.read(c.output(*t.b, d, t.o)) == want);
    const auto g = testing::random_vec(t.n * t.d, 3);
    std::vector<float> back = g;
    clip_rows_backward(back, clipped, scale, t.n, clip);
    CHECK(t.read(c.gradient(*t.b, t.key, t.make(g))) == back);
  }
}

TEST_CASE("the NoPeek filter measures the distance correlation and adds its share of its gradient to what comes back") {
  bench t;
  const double weight = 2.0;
  std::vector<float> grad(t.ov.size());
  const double r = distance_correlation(t.xv, 8, t.ov, t.d, t.n, grad);
  filter_chain c;
  c.add(std::make_unique<nopeek_filter>(weight));
  auto d = t.leaving(1, 12);  // 6 of the step's 12 samples: half the term
  CHECK(c.output(*t.b, d, t.o).buf() == t.o.buf());
  auto* f = c.find<nopeek_filter>();
  REQUIRE(f != nullptr);
  const auto [sum, count] = f->take();
  CHECK(count == 1);
  CHECK(sum == r);
  CHECK(f->take().second == 0);
  const auto g = testing::random_vec(t.n * t.d, 3);
  const auto got = t.read(c.gradient(*t.b, t.key, t.make(g)));
  const float w = static_cast<float>(weight * 6.0 / 12.0);
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(got[i] == g[i] + grad[i] * w);
}

TEST_CASE("the gradient check scores what comes back against the labels, or their sub-classes under label groups") {
  bench t;
  const auto g = testing::random_vec(t.n * t.d, 3);
  for (const int groups : {1, 3}) {
    CAPTURE(groups);
    std::vector<std::int32_t> targets = t.yv;
    if (groups > 1)
      core::group_targets(t.yv, groups,
                          static_cast<std::uint32_t>(core::micro_batch_seed(
                              0, t.key.device, t.key.step, t.key.micro_batch, core::stream::label_groups)),
                          targets);
    filter_chain c;
    c.add(std::make_unique<gradient_check_filter>(1, 0.5));
    auto d = t.leaving(groups);
    c.output(*t.b, d, t.o);
    CHECK(c.gradient(*t.b, t.key, t.make(g)).buf() != nullptr);
    const gradient_monitor& m = c.find<gradient_check_filter>()->monitor();
    REQUIRE(m.ready());
    CHECK(m.mean() == label_alignment(g, t.n, targets));
  }
}

TEST_CASE("once its window is full the gradient check scores every fourth micro-batch") {
  bench t;
  filter_chain c;
  c.add(std::make_unique<gradient_check_filter>(2, 0.5));
  const auto& m = c.find<gradient_check_filter>()->monitor();
  std::vector<std::uint32_t> scored;
  for (std::uint32_t mb = 0; mb < 10; ++mb) {
    t.key.micro_batch = mb;
    auto d = t.leaving();
    c.output(*t.b, d, t.o);
    const auto g = testing::random_vec(t.n * t.d, 100 + mb);
    const double before = m.ready() ? m.mean() : NAN;
    c.gradient(*t.b, t.key, t.make(g));
    if (!(m.mean() == before)) scored.push_back(mb);
  }
  // 0 and 1 fill the window; then 2, 6 (every fourth after it).
  CHECK(scored == std::vector<std::uint32_t>{0, 1, 2, 6});
}

TEST_CASE("the gradient hook sees what left and changes the gradient before the check and the clipping see it") {
  bench t;
  std::vector<float> left;
  device_defences dd;
  dd.activation_clip = 1.0;
  dd.check_window = 1;
  dd.hook = [&](std::vector<float>& g, const std::vector<float>& sent, std::int64_t n) {
    left = sent;
    CHECK(n == 6);
    for (float& v : g) v = 1.0f;
  };
  filter_chain c = device_filters(dd);
  REQUIRE(c.size() == 3);
  auto d = t.leaving();
  const auto sent = t.read(c.output(*t.b, d, t.o));
  const auto back = t.read(c.gradient(*t.b, t.key, t.make(testing::random_vec(t.n * t.d, 3))));
  CHECK(left == sent);
  std::vector<float> clipped = t.ov, ones(t.ov.size(), 1.0f);
  const auto scale = clip_rows(clipped, t.n, 1.0);
  CHECK(c.find<gradient_check_filter>()->monitor().mean() == label_alignment(ones, t.n, t.yv));
  clip_rows_backward(ones, clipped, scale, t.n, 1.0);
  CHECK(back == ones);
}

TEST_CASE("label filters: equalised rows share the root-mean-square norm, noise adds each row its gap to the largest") {
  bench t;
  double sum2 = 0;
  for (std::int64_t i = 0; i < t.n; ++i) sum2 += row_norm(t.ov, i, t.d) * row_norm(t.ov, i, t.d);
  const double rms = std::sqrt(sum2 / static_cast<double>(t.n));

  filter_chain eq;
  eq.add(std::make_unique<label_equalise_filter>());
  const auto e = t.read(eq.loss_gradient(*t.b, t.key, t.o));
  for (std::int64_t i = 0; i < t.n; ++i) CHECK(row_norm(e, i, t.d) == doctest::Approx(rms).epsilon(1e-5));

  // Noise after equalising adds next to nothing: every gap is 0 but for rounding.
  filter_chain both = device_filters({.gradient_noise = 1.0, .equalise = true, .seed = 5});
  const auto en = t.read(both.loss_gradient(*t.b, t.key, t.o));
  for (std::size_t k = 0; k < e.size(); ++k) CHECK(en[k] == doctest::Approx(e[k]).epsilon(1e-3));

  filter_chain noise = device_filters({.gradient_noise = 2.0, .seed = 5});
  const auto a = t.read(noise.loss_gradient(*t.b, t.key, t.o));
  CHECK(a == t.read(noise.loss_gradient(*t.b, t.key, t.o)));  // one stream per micro-batch
  micro_batch_key other = t.key;
  other.micro_batch = 3;
  CHECK(a != t.read(noise.loss_gradient(*t.b, other, t.o)));
  std::int64_t top = 0;
  for (std::int64_t i = 1; i < t.n; ++i)
    if (row_norm(t.ov, i, t.d) > row_norm(t.ov, top, t.d)) top = i;
  for (std::int64_t k = 0; k < t.d; ++k) CHECK(a[top * t.d + k] == t.ov[top * t.d + k]);
  int changed = 0;
  for (std::size_t k = 0; k < a.size(); ++k) changed += a[k] != t.ov[k];
  CHECK(changed == (t.n - 1) * t.d);
}

TEST_CASE("discarding a device forgets what its filters kept of its micro-batches in flight") {
  bench t;
  filter_chain c = device_filters({.activation_clip = 1.0, .nopeek = 1.0});
  auto d = t.leaving();
  c.output(*t.b, d, t.o);
  c.discard(4);  // another device
  const auto g = testing::random_vec(t.n * t.d, 3);
  CHECK(t.read(c.gradient(*t.b, t.key, t.make(g))) != g);
  c.output(*t.b, d, t.o);
  c.discard(t.key.device);
  CHECK(t.read(c.gradient(*t.b, t.key, t.make(g))) == g);
}

TEST_CASE("a device's defaults install no filter") {
  CHECK(device_filters({}).empty());
}
