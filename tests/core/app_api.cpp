// The API apps write against: a model built in C++ is the model its JSON spec describes, and an
// app's own data source trains exactly as a loaded data set holding the same samples.
#include <doctest/doctest.h>

#include <cmath>

#include "../support/error_of.h"
#include "cleave/backend/registry.h"
#include "cleave/core/data_source.h"
#include "cleave/core/dataset.h"
#include "cleave/core/model_builder.h"
#include "cleave/core/trainer.h"

using namespace cleave;

namespace {

void check_same(const core::model_spec& a, const core::model_spec& b) {
  CHECK(a.name == b.name);
  CHECK(a.input == b.input);
  CHECK(a.n_classes == b.n_classes);
  REQUIRE(a.n_blocks() == b.n_blocks());
  for (int i = 0; i < a.n_blocks(); ++i) {
    CAPTURE(i);
    const auto &x = a.blocks[static_cast<std::size_t>(i)], &y = b.blocks[static_cast<std::size_t>(i)];
    CHECK(x.kind == y.kind);
    CHECK(x.in == y.in);
    CHECK(x.out == y.out);
    CHECK(x.n_params == y.n_params);
    CHECK(x.n_buffers == y.n_buffers);
    CHECK(x.flops == y.flops);
  }
}

// A source whose samples are computed, not stored: value = sample * 0.01 + position * 0.001.
class computed_source final : public core::data_source {
 public:
  explicit computed_source(std::int64_t n) : n_(n) {}
  std::int64_t size() const override { return n_; }
  core::shape sample_shape() const override { return {1, 4, 4}; }
  int class_count() const override { return 3; }
  std::vector<std::int32_t> labels() const override {
    std::vector<std::int32_t> y(static_cast<std::size_t>(n_));
    for (std::int64_t i = 0; i < n_; ++i) y[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i % 3);
    return y;
  }
  void fetch(const std::int64_t* idx, std::int64_t n, float* x, std::int32_t* y) const override {
    for (std::int64_t i = 0; i < n; ++i) {
      for (int j = 0; j < 16; ++j) x[i * 16 + j] = static_cast<float>(idx[i]) * 0.01f + static_cast<float>(j) * 0.001f;
      y[i] = static_cast<std::int32_t>(idx[i] % 3);
    }
  }
  std::string describe() const override { return "computed"; }

 private:
  std::int64_t n_;
};

// The same samples as a core::dataset: pixel p of channel 0 maps to table[p]; each sample's 16
// pixels are distinct codes, and the table holds the computed value of each code.
core::dataset as_dataset(const computed_source& s) {
  core::dataset d;
  d.name = "as-dataset";
  d.item = s.sample_shape();
  d.n_classes = s.class_count();
  d.y = s.labels();
  // Codes: sample i pixel j -> (i * 16 + j) % 256 would collide; the test keeps n * 16 <= 256.
  REQUIRE(s.size() * 16 <= 256);
  d.table.assign(256, 0.0f);
  std::vector<float> x(static_cast<std::size_t>(s.size() * 16));
  std::vector<std::int32_t> y(static_cast<std::size_t>(s.size()));
  std::vector<std::int64_t> idx(static_cast<std::size_t>(s.size()));
  for (std::int64_t i = 0; i < s.size(); ++i) idx[static_cast<std::size_t>(i)] = i;
  s.fetch(idx.data(), s.size(), x.data(), y.data());
  for (std::size_t k = 0; k < x.size(); ++k) {
    d.pixels.push_back(static_cast<std::uint8_t>(k));
    d.table[k] = x[k];
  }
  return d;
}

std::vector<float> params_of(core::trainer& t, core::backend& b) {
  std::vector<float> p(static_cast<std::size_t>(t.model_stage().n_params()));
  b.download(t.model_stage().params(), p.data());
  return p;
}

}  // namespace

TEST_CASE("a model built in C++ is the model its JSON spec text describes") {
  core::model_builder b("har", {3, 1, 32}, 6);
  b.conv2d(8, {1, 5}, 1, 0)
      .batchnorm2d()
      .relu()
      .maxpool2d({1, 2})
      .residual(core::layer_chain().conv2d(8, 1, 1, 0, false).relu(), core::layer_chain(), true)
      .avgpool2d({1, 2}, core::size2{1, 2})
      .dropout(0.25)
      .flatten()
      .linear(6);
  // Written by hand the way a spec file would be (fields in any order).
  const std::string text = R"({"name": "har", "input": [3, 1, 32], "classes": 6, "blocks": [
    {"type": "conv2d", "out_channels": 8, "kernel": [1, 5], "stride": 1, "padding": 0, "bias": true},
    {"type": "batchnorm2d", "eps": 1e-5, "momentum": 0.1},
    {"type": "relu"},
    {"type": "maxpool2d", "kernel": [1, 2], "padding": 0},
    {"type": "residual", "relu": true, "body": [
      {"type": "conv2d", "out_channels": 8, "kernel": 1, "stride": 1, "padding": 0, "bias": false},
      {"type": "relu"}]},
    {"type": "avgpool2d", "kernel": [1, 2], "stride": [1, 2], "padding": 0},
    {"type": "dropout", "p": 0.25},
    {"type": "flatten"},
    {"type": "linear", "out_features": 6, "bias": true}]})";
  const auto expect = core::parse_model_spec(text, "har");
  const auto built = b.build();
  check_same(built, expect);
  CHECK(built.json == expect.json);  // the same spec travels to the other nodes
  CHECK(core::parse_model_spec(b.json(), "har").json == built.json);
  CHECK(b.n_blocks() == 9);
}

TEST_CASE("the builder writes the zoo's resnet8 block for block") {
  auto basic = [](int out, int stride, bool project) {
    core::layer_chain body;
    body.conv2d(out, 3, stride, 1, false).batchnorm2d().relu().conv2d(out, 3, 1, 1, false).batchnorm2d();
    core::layer_chain shortcut;
    if (project) shortcut.conv2d(out, 1, stride, 0, false).batchnorm2d();
    return std::pair{body, shortcut};
  };
  core::model_builder b("resnet8", {3, 32, 32}, 10);
  b.conv2d(16, 3, 1, 1, false).batchnorm2d().relu();
  for (const auto& [out, stride, project] : {std::tuple{16, 1, false}, {32, 2, true}, {64, 2, true}}) {
    const auto [body, shortcut] = basic(out, stride, project);
    b.residual(body, shortcut);
  }
  b.global_avg_pool().linear(10);
  check_same(b.build(), core::zoo_model("resnet8", {3, 32, 32}, 10));
}

TEST_CASE("the builder writes the zoo's mobilenetv2 (depthwise convs, relu6) block for block") {
  // Width 0.25: widths 8, 8, 8, 8, 16, 24, 40, 80 (never below 8), the last conv 1280.
  core::model_builder b("mobilenetv2:0.25", {3, 32, 32}, 10);
  b.conv2d(8, 3, 1, 1, false).batchnorm2d().relu6();
  const int settings[][4] = {{1, 16, 1, 1}, {6, 24, 2, 1},  {6, 32, 3, 2}, {6, 64, 4, 2},
                             {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
  const int widths[] = {8, 8, 8, 16, 24, 40, 80};
  int in = 8;
  for (int s = 0; s < 7; ++s)
    for (int i = 0; i < settings[s][2]; ++i) {
      const int out = widths[s], stride = i == 0 ? settings[s][3] : 1, hidden = in * settings[s][0];
      core::layer_chain body;
      if (settings[s][0] != 1) body.conv2d(hidden, 1, 1, 0, false).batchnorm2d().relu6();
      body.conv2d(hidden, 3, stride, 1, false, hidden).batchnorm2d().relu6().conv2d(out, 1, 1, 0, false).batchnorm2d();
      if (stride == 1 && in == out) {
        b.residual(body, false);
      } else {
        // Layers of a block that adds nothing back are blocks of their own.
        b.append(body);
      }
      in = out;
    }
  b.conv2d(1280, 1, 1, 0, false).batchnorm2d().relu6().global_avg_pool().linear(10);
  check_same(b.build(), core::zoo_model("mobilenetv2:0.25", {3, 32, 32}, 10));
}

TEST_CASE("a bad setting in the builder is refused with the message the same JSON gets") {
  core::model_builder b("bad", {1, 8, 8}, 4);
  b.conv2d(4, 9).flatten().linear(4);  // a 9x9 kernel over 8x8
  const std::string text = R"({"name": "bad", "input": [1, 8, 8], "classes": 4, "blocks": [
    {"type": "conv2d", "out_channels": 4, "kernel": 9, "stride": 1, "padding": 0, "bias": true},
    {"type": "flatten"}, {"type": "linear", "out_features": 4, "bias": true}]})";
  const std::string from_json = testing::error_of([&] { core::parse_model_spec(text, "bad"); });
  CHECK(from_json == "model spec 'bad': block 0 (conv2d): kernel 9x9 does not fit input (1,8,8) with padding 0");
  CHECK(testing::error_of([&] { b.build(); }) == from_json);

  core::model_builder wrong_out("out", {1, 8, 8}, 4);
  wrong_out.flatten().linear(5);
  CHECK(testing::error_of([&] { wrong_out.build(); }).find("model spec 'out': block 1 (linear): outputs (5)") == 0);
}

TEST_CASE("an app's own data source trains and evaluates as a data set holding the same samples") {
  const auto src = std::make_shared<computed_source>(12);
  const core::dataset d = as_dataset(*src);
  core::model_builder mb("tiny", src->sample_shape(), src->class_count());
  mb.flatten().linear(8).relu().linear(3);
  const auto m = mb.build();
  core::train_config c;
  c.batch = 4;
  c.seed = 3;
  auto b = backend::make_backend("reference");
  core::trainer from_source(*b, m, c), from_dataset(*b, m, c);
  for (int e = 0; e < 2; ++e) {
    CHECK(from_source.train_epoch(*src, e, nullptr) == 12);
    CHECK(from_dataset.train_epoch(d, e, nullptr) == 12);
  }
  CHECK(params_of(from_source, *b) == params_of(from_dataset, *b));
  const auto es = from_source.evaluate(*src), ed = from_dataset.evaluate(d);
  CHECK(es.n == 12);
  CHECK(es.loss == ed.loss);
  CHECK(es.accuracy == ed.accuracy);
}

TEST_CASE("a subset of a source holds the samples asked for, in that order") {
  const auto src = std::make_shared<computed_source>(10);
  const auto sub = core::subset_of(src, {7, 2, 9});
  CHECK(sub->size() == 3);
  CHECK(sub->labels() == std::vector<std::int32_t>{1, 2, 0});
  std::vector<float> x(16), want(16);
  std::int32_t y = -1, want_y = -1;
  const std::int64_t i = 1, j = 2;
  sub->fetch(&i, 1, x.data(), &y);
  src->fetch(&j, 1, want.data(), &want_y);
  CHECK(x == want);
  CHECK(y == want_y);
  CHECK(testing::error_of([&] { core::subset_of(src, {10}); }) ==
        "data source 'computed': sample 10 asked for, it has 10");
  // A data set is copied as dataset::subset copies it.
  const auto d = std::make_shared<core::dataset>(as_dataset(computed_source(10)));
  const auto dsub = core::subset_of(d, {4, 5});
  REQUIRE(dynamic_cast<const core::dataset*>(dsub.get()) != nullptr);
  CHECK(dsub->labels() == std::vector<std::int32_t>{1, 2});
}

TEST_CASE("a source that cannot augment says so, and a source's faults are named") {
  const computed_source src(4);
  std::vector<float> x(16);
  std::int32_t y = 0;
  const std::int64_t i = 0;
  core::augment_config a;
  src.fetch_augmented(&i, 1, x.data(), &y, a, 1, 0);  // nothing enabled: a plain fetch
  a.flip = true;
  CHECK(testing::error_of([&] { src.fetch_augmented(&i, 1, x.data(), &y, a, 1, 0); }) ==
        "data source 'computed' cannot augment its samples (asked for flip)");
  core::check_source(src);

  class bad_labels final : public core::data_source {
   public:
    std::int64_t size() const override { return 2; }
    core::shape sample_shape() const override { return {1, 1, 4}; }
    int class_count() const override { return 2; }
    std::vector<std::int32_t> labels() const override { return {0, 2}; }
    void fetch(const std::int64_t*, std::int64_t, float*, std::int32_t*) const override {}
    std::string describe() const override { return "sensor"; }
  };
  CHECK(testing::error_of([] { core::check_source(bad_labels()); }) ==
        "data source 'sensor': label 2 of sample 1 is not in [0, 2)");
}
