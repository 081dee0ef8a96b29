// Model specs: the zoo builds, and bad specs are refused with messages naming block and field.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../support/error_of.h"
#include "cleave/backend/registry.h"
#include "cleave/core/data_source.h"
#include "cleave/core/error.h"
#include "cleave/core/model.h"
#include "cleave/core/random.h"
#include "cleave/core/stage.h"
#include "cleave/core/trainer.h"

using namespace cleave;

namespace {

std::string error_of(const std::string& text) {
  return cleave::testing::error_of([&] { core::parse_model_spec(text, "net.json"); });
}

}  // namespace

TEST_CASE("the zoo builds every model for 28x28x1 and 32x32x3 inputs") {
  const auto lenet = core::zoo_model("lenet5", core::shape{1, 28, 28}, 10);
  CHECK(lenet.n_params() == 61706);  // the classic LeNet-5 parameter count
  CHECK(lenet.n_blocks() == 12);
  CHECK(lenet.blocks[6].in == core::shape{16, 5, 5});
  for (const auto& name : core::zoo_names())
    for (const auto& in : {core::shape{1, 28, 28}, core::shape{3, 32, 32}}) {
      CAPTURE(name);
      const auto m = core::zoo_model(name, in, 10);
      CHECK(m.blocks.back().out == core::shape{10});
    }
  const auto r = core::zoo_model("resnet8", core::shape{3, 32, 32}, 10);
  CHECK(r.blocks[5].out == core::shape{64, 8, 8});
}

TEST_CASE("resnet18 has torchvision's CIFAR ResNet-18 parameter count and one block per basic block") {
  const auto m = core::zoo_model("resnet18", core::shape{3, 32, 32}, 10);
  CHECK(m.n_params() == 11173962);
  REQUIRE(m.n_blocks() == 13);  // conv, bn, relu, 8 basic blocks, pool, linear
  for (int b = 3; b <= 10; ++b) CHECK(m.blocks[static_cast<std::size_t>(b)].kind == "residual");
  CHECK(m.blocks[4].out == core::shape{64, 32, 32});
  CHECK(m.blocks[5].out == core::shape{128, 16, 16});
  CHECK(m.blocks[10].out == core::shape{512, 4, 4});
  // Fashion-MNIST: one input channel (576 fewer stem weights than three), sides 28, 14, 7, 4.
  const auto f = core::zoo_model("resnet18", core::shape{1, 28, 28}, 10);
  CHECK(f.n_params() == 11173962 - 2 * 64 * 9);
  CHECK(f.blocks[10].out == core::shape{512, 4, 4});
  // A residual block's FLOPs are its layers' plus the add and ReLU: the whole model sums to
  // about 0.56 G multiply-adds on CIFAR, as usually quoted for this network.
  double flops = 0;
  for (const auto& b : m.blocks) flops += b.flops;
  CHECK(flops / 2 > 0.55e9);
  CHECK(flops / 2 < 0.57e9);
}

TEST_CASE("vgg11-bn drops the max pool that would take a 28x28 input below 1x1") {
  const auto c = core::zoo_model("vgg11-bn", core::shape{3, 32, 32}, 10);
  // 8 convs with batch norm: 9,220,480 + 8 x 2 x width batch-norm weights, + 5130 classifier.
  CHECK(c.n_params() == 9231114);
  CHECK(c.n_blocks() == 8 * 3 + 5 + 2);
  CHECK(c.blocks[static_cast<std::size_t>(c.n_blocks() - 2)].in == core::shape{512, 1, 1});
  const auto f = core::zoo_model("vgg11-bn", core::shape{1, 28, 28}, 10);
  CHECK(f.n_blocks() == 8 * 3 + 4 + 2);
  CHECK(f.blocks[static_cast<std::size_t>(f.n_blocks() - 2)].in == core::shape{512, 1, 1});
  CHECK(f.n_params() == c.n_params() - 2 * 64 * 9);
}

TEST_CASE("vgg11_bn is refused pointing to the zoo's name for it") {
  const auto e = cleave::testing::error_of([] { core::zoo_model("vgg11_bn", core::shape{3, 32, 32}, 10); });
  CHECK(e.find("unknown model 'vgg11_bn' (did you mean 'vgg11-bn'?)") == 0);
}

TEST_CASE("every zoo model's spec round-trips through its JSON") {
  for (const auto& name : core::zoo_names())
    for (const auto& in : {core::shape{1, 28, 28}, core::shape{3, 32, 32}}) {
      CAPTURE(name);
      CAPTURE(in.str());
      const auto m = core::zoo_model(name, in, 10);
      const auto back = core::parse_model_spec(m.json, "round trip");
      CHECK(back.json == m.json);
      CHECK(back.name == m.name);
      CHECK(back.input == m.input);
      CHECK(back.n_classes == m.n_classes);
      REQUIRE(back.n_blocks() == m.n_blocks());
      for (int b = 0; b < m.n_blocks(); ++b) {
        const auto &x = m.blocks[static_cast<std::size_t>(b)], &y = back.blocks[static_cast<std::size_t>(b)];
        CHECK(x.kind == y.kind);
        CHECK(x.out == y.out);
        CHECK(x.n_params == y.n_params);
        CHECK(x.n_buffers == y.n_buffers);
        CHECK(x.flops == y.flops);
      }
    }
}

TEST_CASE("resnet18 and vgg11-bn take a training step with a finite loss and moved weights") {
  // onednn where this build has it (resnet18 is 11M parameters; the reference backend is slow).
  std::string be_name = "reference";
  for (const auto& b : backend::list_backends())
    if (b.name == "onednn" && b.available) be_name = b.name;
  auto be = backend::make_backend(be_name);
  for (const std::string name : {"resnet18", "vgg11-bn"}) {
    CAPTURE(name);
    CAPTURE(be_name);
    const int n = be_name == "onednn" ? 2 : 1;
    const auto m = core::zoo_model(name, core::shape{1, 28, 28}, 10);
    core::train_config c;
    c.seed = 3;
    c.opt.lr = 0.01f;
    core::trainer t(*be, m, c);
    std::vector<float> x(static_cast<std::size_t>(n * 784));
    core::rng r(5);
    for (auto& v : x) v = r.uniform(-1.0f, 1.0f);
    std::vector<std::int32_t> y(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) y[static_cast<std::size_t>(i)] = i % 10;
    float loss[2] = {0, 0};
    for (int s = 0; s < 2; ++s) {
      const auto l = t.step(x.data(), y.data(), n);
      be->download(l, &loss[s]);
    }
    CHECK(std::isfinite(loss[0]));
    CHECK(std::isfinite(loss[1]));
    CHECK(loss[0] > 0.0f);
    CHECK(loss[1] != loss[0]);  // the first step changed the weights
  }
}

TEST_CASE("an unknown model name lists the zoo") {
  try {
    core::zoo_model("vgg", core::shape{1, 28, 28}, 10);
    FAIL("no error");
  } catch (const core::error& e) {
    CHECK(std::string(e.what()).find("unknown model 'vgg'") != std::string::npos);
    CHECK(std::string(e.what()).find("lenet5") != std::string::npos);
  }
}

TEST_CASE("an unknown layer type is refused naming the block") {
  const auto msg = error_of(R"({"input":[1,8,8],"classes":2,"blocks":[{"type":"flatten"},{"type":"dense"}]})");
  CHECK(msg.find("model spec 'net.json': block 1 (dense): unknown block type 'dense'") == 0);
}

TEST_CASE("a missing field is refused naming the block and the field") {
  const auto msg = error_of(R"({"input":[1,8,8],"classes":2,"blocks":[{"type":"conv2d","kernel":3}]})");
  CHECK(msg == "model spec 'net.json': block 0 (conv2d): field 'out_channels': missing (an integer is required)");
}

TEST_CASE("a field of the wrong type or an unknown field is refused") {
  CHECK(error_of(R"({"input":[4],"classes":2,"blocks":[{"type":"linear","out_features":"two"}]})")
            .find("block 0 (linear): field 'out_features': must be an integer") != std::string::npos);
  CHECK(error_of(R"({"input":[4],"classes":2,"blocks":[{"type":"linear","out_features":2,"bais":false}]})")
            .find("block 0 (linear): field 'bais': unknown") != std::string::npos);
}

TEST_CASE("a shape mismatch between blocks is refused naming the block") {
  // linear directly after a conv output (C,H,W) without flatten
  const auto msg = error_of(
      R"({"input":[1,8,8],"classes":2,"blocks":[{"type":"conv2d","out_channels":2,"kernel":3},{"type":"linear","out_features":2}]})");
  CHECK(msg.find("block 1 (linear): linear expects a flat (F) input, got (2,6,6)") != std::string::npos);
  // a kernel larger than its input
  CHECK(error_of(R"({"input":[1,4,4],"classes":2,"blocks":[{"type":"conv2d","out_channels":2,"kernel":5}]})")
            .find("block 0 (conv2d): kernel 5x5 does not fit input (1,4,4)") != std::string::npos);
  // a residual whose body changes the shape without a shortcut
  CHECK(
      error_of(
          R"({"input":[2,4,4],"classes":2,"blocks":[{"type":"residual","body":[{"type":"conv2d","out_channels":3,"kernel":1}]}]})")
          .find("block 0 (residual): residual body output (3,4,4) does not match shortcut output (2,4,4)") !=
      std::string::npos);
  // the last block not producing the classes
  CHECK(error_of(R"({"input":[4],"classes":3,"blocks":[{"type":"linear","out_features":2}]})")
            .find("block 0 (linear): outputs (2) but the model has 3 classes") != std::string::npos);
}

TEST_CASE("errors inside a residual block name the inner layer") {
  const auto msg = error_of(
      R"({"input":[2,4,4],"classes":2,"blocks":[{"type":"residual","body":[{"type":"relu"},{"type":"conv2d","kernel":1}]}]})");
  CHECK(msg.find("block 0 (residual): body[1] (conv2d): field 'out_channels': missing") != std::string::npos);
}

TEST_CASE("malformed JSON and a missing input are refused") {
  CHECK(error_of("{").find("model spec 'net.json': not valid JSON") == 0);
  CHECK(error_of(R"({"classes":2,"blocks":[{"type":"relu"}]})") == "model spec 'net.json': field 'input': missing");
}

TEST_CASE("a number too large for a double is refused as a spec error, not an escaping JSON exception") {
  const auto e = error_of(R"({"input": [8], "classes": 8, "blocks": [{"type": "relu", "p": 1e400}]})");
  CHECK(e.find("model spec 'net.json': not valid JSON") == 0);
  CHECK(e.find("number overflow parsing '1e400'") != std::string::npos);
}

TEST_CASE("a convolution whose weights per output channel cannot be counted in 64 bits is refused") {
  // 2^24 input channels x a 2^20 x 2^20 kernel: 2^64 weights per output channel.
  const auto e = error_of(
      R"({"input": [1, 1, 1], "classes": 2, "blocks": [{"type": "conv2d", "out_channels": 16777216, "kernel": 1},)"
      R"( {"type": "conv2d", "out_channels": 1, "kernel": 1048576, "stride": 16777216, "padding": 16777216},)"
      R"( {"type": "flatten"}, {"type": "linear", "out_features": 2}]})");
  CHECK(e ==
        "model spec 'net.json': block 1 (conv2d): field 'kernel': 1048576x1048576 over 16777216 input channels "
        "is more than the limit of 1073741824 weights per output channel");
}

TEST_CASE("a spec nested deeper than the limit is refused while parsing, not by a stack overflow") {
  // 20,000 residual blocks inside each other: 580 KB of JSON.
  std::string body = R"({"type": "relu"})";
  std::string open, close;
  for (int i = 0; i < 20000; ++i) {
    open += R"({"type": "residual", "body": [)";
    close += "]}";
  }
  const std::string spec = R"({"input": [8], "classes": 8, "blocks": [)" + open + body + close + "]}";
  const auto e = error_of(spec);
  CHECK(e.find("model spec 'net.json'") != std::string::npos);
  CHECK(e.find("nested deeper than 64 levels") != std::string::npos);
}

TEST_CASE("a spec with more layers than the limit is refused") {
  std::string blocks;
  for (int i = 0; i < core::spec_limits::max_layers + 1; ++i)
    blocks += std::string(i ? "," : "") + R"({"type": "relu"})";
  const auto e = error_of(R"({"input": [8], "classes": 8, "blocks": [)" + blocks + "]}");
  CHECK(e.find("block 10000") != std::string::npos);
  CHECK(e.find("more than 10000 layers") != std::string::npos);
}

TEST_CASE("huge widths and models too big to allocate are refused before anything is allocated") {
  auto linear = [](const std::string& input, const std::string& out) {
    return R"({"input": )" + input + R"(, "classes": 10, "blocks": [{"type": "linear", "out_features": )" + out + "}]}";
  };
  const auto wide = error_of(linear("[784]", "1000000000000"));
  CHECK(wide.find("block 0 (linear): field 'out_features': 1000000000000 is out of range (at most 16777216)") !=
        std::string::npos);
  // 2^20 inputs x 2^12 outputs: 4.3 billion weights, 16 GiB as f32.
  const auto big = error_of(linear("[1048576]", "4096"));
  CHECK(big.find("block 0: the model would hold more than 4.295e+09 parameters") != std::string::npos);
  CHECK(big.find("16.0 GiB as f32; the limit is 1073741824 = 4.0 GiB") != std::string::npos);
  const auto tall = error_of(R"({"input": [1048576, 1024, 1024], "classes": 10, "blocks": [{"type": "relu"}]})");
  CHECK(tall.find("field 'input'") != std::string::npos);
  CHECK(tall.find("values per sample") != std::string::npos);
}

TEST_CASE("text from a peer or a file is logged escaped and cut short") {
  CHECK(core::printable("round 3/5: ok") == "round 3/5: ok");
  CHECK(core::printable("x\n[info] round 9/9\x1b[2J") == "x\\x0a[info] round 9/9\\x1b[2J");
  CHECK(core::printable("a\\b\xff") == "a\\x5cb\\xff");
  CHECK(core::printable(std::string(300, 'a'), 10) == std::string(10, 'a') + "... (290 more bytes)");
  const auto e = error_of(R"({"input": [8], "classes": 8, "blocks": [{"type": "re\nlu\u001b[31m"}]})");
  CHECK(e.find("unknown block type 're\\x0alu\\x1b[31m'") != std::string::npos);
  CHECK(e.find('\n') == std::string::npos);
}

TEST_CASE("negative pooling padding and class counts beyond 32 bits are refused") {
  CHECK(error_of(
            R"({"input": [1, 8, 8], "classes": 2, "blocks": [{"type": "maxpool2d", "kernel": 2, "padding": [0, -1]},)"
            R"( {"type": "flatten"}, {"type": "linear", "out_features": 2}]})")
            .find("padding must be between 0 and half the kernel") != std::string::npos);
  CHECK(error_of(R"({"input": [4], "classes": 4294967298, "blocks": [{"type": "linear", "out_features": 2}]})")
            .find("field 'classes': missing or not an integer from 2 to 1000000") != std::string::npos);
}

TEST_CASE("mobilenetv2 has torchvision's parameter count, depthwise blocks and a width multiplier") {
  const auto m = core::zoo_model("mobilenetv2", core::shape{3, 32, 32}, 10);
  // torchvision.models.mobilenet_v2(num_classes=10): the strides differ (CIFAR-style), the
  // weights do not.
  CHECK(m.n_params() == 2236682);
  CHECK(m.blocks.back().out == core::shape{10});
  int depthwise = 0, residual = 0, relu6 = 0;
  for (const auto& b : m.blocks) {
    residual += b.kind == "residual";
    relu6 += b.kind == "relu6";
  }
  // 17 inverted residual blocks; 10 keep their width and stride and add the input back.
  CHECK(residual == 10);
  CHECK(relu6 > 0);
  const std::string spec = m.json;
  for (std::size_t at = spec.find("\"groups\""); at != std::string::npos; at = spec.find("\"groups\"", at + 1))
    ++depthwise;
  CHECK(depthwise == 17);
  // 32x32 ends at 4x4 before the global pool; 28x28 at 4x4 too (28 -> 14 -> 7 -> 4).
  for (const auto& in : {core::shape{3, 32, 32}, core::shape{1, 28, 28}}) {
    const auto mm = core::zoo_model("mobilenetv2", in, 10);
    CHECK(mm.blocks[mm.n_blocks() - 2].in == core::shape{1280, 4, 4});
  }
  const auto half = core::zoo_model("mobilenetv2:0.5", core::shape{3, 32, 32}, 10);
  CHECK(half.n_params() < m.n_params() / 2);
  CHECK(cleave::testing::error_of([] {
          core::zoo_model("mobilenetv2:x", core::shape{3, 32, 32}, 10);
        }).find("width multiplier") != std::string::npos);
}

TEST_CASE("grouped convolutions and clamps are checked like every other field") {
  CHECK(error_of(R"({"input":[6,8,8],"classes":2,"blocks":[{"type":"conv2d","out_channels":4,"kernel":3,"groups":4},
      {"type":"flatten"},{"type":"linear","out_features":2}]})")
            .find("block 0 (conv2d): groups 4 must divide the input channels (6) and out_channels (4)") !=
        std::string::npos);
  CHECK(error_of(R"({"input":[6,8,8],"classes":2,"blocks":[{"type":"conv2d","out_channels":6,"kernel":3,"groups":0},
      {"type":"flatten"},{"type":"linear","out_features":2}]})")
            .find("groups must be >= 1") != std::string::npos);
  CHECK(error_of(R"({"input":[4],"classes":2,"blocks":[{"type":"clamp","min":3,"max":1},
      {"type":"linear","out_features":2}]})")
            .find("block 0 (clamp): clamp needs finite min < max") != std::string::npos);
  const auto m = core::parse_model_spec(R"({"input":[6,8,8],"classes":2,"blocks":[
      {"type":"conv2d","out_channels":12,"kernel":3,"groups":3,"bias":false},{"type":"relu6"},
      {"type":"flatten"},{"type":"linear","out_features":2}]})",
                                        "net.json");
  CHECK(m.blocks[0].n_params == 12 * 2 * 3 * 3);
  CHECK(m.blocks[1].kind == "relu6");
}

TEST_CASE("label groups widen the last linear layer, and the spec carries them") {
  const auto lenet = core::zoo_model("lenet5", core::shape{1, 28, 28}, 10);
  const auto g = core::with_label_groups(lenet, 4);
  CHECK(g.label_groups == 4);
  CHECK(g.n_classes == 10);
  CHECK(g.blocks.back().out == core::shape{40});
  CHECK(g.n_params() == lenet.n_params() + 3 * (84 * 10 + 10));
  // The spec travels as JSON: a node parsing it gets the same model.
  const auto again = core::parse_model_spec(g.json, "peer");
  CHECK(again.label_groups == 4);
  CHECK(again.blocks.back().out == core::shape{40});
  CHECK(core::with_label_groups(lenet, 1).json == lenet.json);

  const std::string tiny = R"({"input":[4],"classes":2,"blocks":[{"type":"linear","out_features":2},{"type":"relu"}]})";
  CHECK(cleave::testing::error_of([&] {
          core::with_label_groups(core::parse_model_spec(tiny, "tiny"), 3);
        }).find("its last block is relu, not the linear layer") != std::string::npos);
  CHECK(cleave::testing::error_of([&] { core::with_label_groups(lenet, 0); }).find("label groups 0") !=
        std::string::npos);
  CHECK(cleave::testing::error_of([&] { core::with_label_groups(g, 2); }).find("4 label groups already") !=
        std::string::npos);
  CHECK(error_of(R"({"input":[4],"classes":2,"label_groups":3,"blocks":[{"type":"linear","out_features":2}]})")
            .find("the last block must output (6)") != std::string::npos);
  CHECK(error_of(R"({"input":[4],"classes":2,"label_groups":0,"blocks":[{"type":"linear","out_features":2}]})")
            .find("field 'label_groups'") != std::string::npos);
  CHECK(error_of(R"({"input":[4],"classes":2,"label_groups":"2","blocks":[{"type":"linear","out_features":2}]})")
            .find("field 'label_groups'") != std::string::npos);
}

TEST_CASE("label groups draw each sample a sub-class of its class, and score on the class logits") {
  std::vector<std::int32_t> y(4000), t(y.size()), again(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>(i % 3);
  core::group_targets(y, 5, 77, t);
  core::group_targets(y, 5, 77, again);
  CHECK(t == again);
  std::vector<int> seen(15, 0);
  for (std::size_t i = 0; i < y.size(); ++i) {
    REQUIRE(t[i] / 5 == y[i]);
    ++seen[static_cast<std::size_t>(t[i])];
  }
  for (const int n : seen) CHECK(n > 4000 / 15 / 2);  // every sub-class drawn, roughly evenly
  core::group_targets(y, 5, 78, again);
  CHECK(t != again);

  // Two rows of 2 classes x 3 sub-classes: class logits are log-sum-exp of each group.
  const std::vector<float> logits{0, 1, 2, 3, -1, 0.5f, -2, -2, -2, 1, 1, 1};
  std::vector<float> cl(4);
  core::class_logits(logits, 2, 2, 3, cl);
  CHECK(cl[0] == doctest::Approx(std::log(std::exp(0.0) + std::exp(1.0) + std::exp(2.0))));
  CHECK(cl[1] == doctest::Approx(std::log(std::exp(3.0) + std::exp(-1.0) + std::exp(0.5))));
  CHECK(cl[2] == doctest::Approx(-2 + std::log(3.0)));
  CHECK(cl[3] == doctest::Approx(1 + std::log(3.0)));
  const std::vector<std::int32_t> labels{0, 1};
  const auto sc = core::score_classes(cl, labels, 2);
  const double l0 = std::log(std::exp(cl[0]) + std::exp(cl[1])) - cl[0];
  const double l1 = std::log(std::exp(cl[2]) + std::exp(cl[3])) - cl[3];
  CHECK(sc.loss == doctest::Approx((l0 + l1) / 2));
  CHECK(sc.correct == 1);  // row 0 prefers class 1
}

TEST_CASE("a trainer with label groups reports the class loss and evaluates on the class logits") {
  auto be = backend::make_backend("reference");
  const auto m = core::with_label_groups(core::zoo_model("mlp", core::shape{1, 4, 4}, 3), 4);
  core::train_config c;
  c.seed = 5;
  c.opt.lr = 0.05f;
  core::trainer t(*be, m, c);
  // Three separable classes: input `class` is high.
  struct three : core::data_source {
    std::vector<float> x;
    std::vector<std::int32_t> y;
    std::int64_t size() const override { return static_cast<std::int64_t>(y.size()); }
    core::shape sample_shape() const override { return core::shape{1, 4, 4}; }
    int class_count() const override { return 3; }
    std::vector<std::int32_t> labels() const override { return y; }
    void fetch(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out) const override {
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(idx[i]);
        std::copy_n(x.data() + k * 16, 16, x_out + i * 16);
        y_out[i] = y[k];
      }
    }
  } d;
  core::rng r(9);
  for (int i = 0; i < 96; ++i) {
    const int cls = i % 3;
    for (int k = 0; k < 16; ++k) d.x.push_back(r.uniform(-0.2f, 0.2f) + (k == cls ? 2.0f : 0.0f));
    d.y.push_back(cls);
  }
  float first = 0, last = 0;
  for (int s = 0; s < 30; ++s) {
    const auto l = t.step(d.x.data() + (s % 3) * 32 * 16, d.y.data() + (s % 3) * 32, 32);
    be->download(l, s == 0 ? &first : &last);
  }
  // Class loss: below log 3 once trained (a sub-class loss could not go under log 4 here).
  CHECK(first > 0.5f);
  CHECK(last < 0.5f);
  const auto ev = t.evaluate(d);
  CHECK(ev.accuracy == doctest::Approx(1.0));
  CHECK(ev.loss < 0.5);
}
