// Writes the fuzz seed corpus: one frame of every message type as nodes build it (the protocol's
// builders), a stream of all of them, the zoo models' specs and nested residual specs as JSON
// texts, and Plan frames carrying those specs. Built by the main build, since the protocol's
// builders need split/ and privacy/; the fuzz target itself is built with clang.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cleave/core/error.h"
#include "cleave/core/model.h"
#include "cleave/protocol/protocol.h"
#include "sample_messages.h"

namespace {

namespace core = cleave::core;
namespace transport = cleave::transport;
namespace protocol = cleave::protocol;
namespace split = cleave::split;
using json = nlohmann::json;

bool write(const std::string& path, std::span<const char> bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

bool write_frame(const std::string& path, const transport::message_builder& b) {
  const auto f = b.frame();
  return write(path, {reinterpret_cast<const char*>(f.data()), f.size()});
}

// The Plan a server sends a device over a model of n blocks (the device keeps the first block,
// the server the rest), carrying the spec as the server sends it.
transport::message_builder plan_with(const std::string& spec, std::uint32_t n) {
  protocol::plan_desc p;
  p.epoch = 1;
  p.model_json = spec;
  p.micro_batch_size = 16;
  p.n_micro_batches = 2;
  p.device_id = 7;
  p.route = split::make_route(false, false, {1}, static_cast<int>(n));
  p.run_id = 1;
  return protocol::make_plan(p);
}

json conv(int out, json kernel, int stride, int pad) {
  return {{"type", "conv2d"}, {"out_channels", out}, {"kernel", kernel}, {"stride", stride}, {"padding", pad}};
}
json simple(const char* type) {
  return {{"type", type}};
}
json spec(const char* name, json input, int classes, json blocks) {
  return {{"name", name}, {"input", input}, {"classes", classes}, {"blocks", blocks}};
}

// Residual blocks `levels` deep, each body a residual and a relu, on a (4,H,W) input.
json nested_residual(int levels) {
  json inner = json::array({conv(4, 3, 1, 1), simple("batchnorm2d"), simple("relu")});
  for (int i = 0; i < levels; ++i)
    inner = json::array({{{"type", "residual"}, {"body", inner}, {"relu", i % 2 == 0}}, simple("relu")});
  return inner;
}

std::vector<std::pair<std::string, json>> nested_specs() {
  std::vector<std::pair<std::string, json>> out;
  const json in = json::array({1, 12, 12});
  // A projection shortcut whose body holds an identity residual.
  json body = json::array({conv(8, json::array({3, 3}), 2, 1),
                           simple("batchnorm2d"),
                           simple("relu"),
                           {{"type", "residual"}, {"body", json::array({conv(8, 3, 1, 1), simple("batchnorm2d")})}}});
  json shortcut = json::array({conv(8, 1, 2, 0), simple("batchnorm2d")});
  out.emplace_back("residual_projection",
                   spec("residual_projection", in, 3,
                        json::array({{{"type", "residual"}, {"body", body}, {"shortcut", shortcut}, {"relu", true}},
                                     simple("global_avg_pool"),
                                     {{"type", "linear"}, {"out_features", 3}}})));
  // A residual in the shortcut of another, then pooling of both kinds and a flat tail.
  json sc = json::array({{{"type", "residual"}, {"body", json::array({simple("relu")})}, {"relu", false}}});
  out.emplace_back(
      "residual_in_shortcut",
      spec("residual_in_shortcut", in, 4,
           json::array({{{"type", "residual"}, {"body", json::array({simple("dropout")})}, {"shortcut", sc}},
                        {{"type", "avgpool2d"},
                         {"kernel", json::array({2, 3})},
                         {"stride", json::array({2, 1})},
                         {"padding", json::array({1, 1})}},
                        {{"type", "maxpool2d"}, {"kernel", 2}},
                        simple("flatten"),
                        {{"type", "batchnorm2d"}, {"eps", 1e-3}, {"momentum", 0.2}},
                        {{"type", "dropout"}, {"p", 0.25}},
                        {{"type", "linear"}, {"out_features", 4}, {"bias", false}}})));
  // Nested 4 deep, and as deep as the JSON depth limit allows (each level adds two).
  for (int levels : {4, core::spec_limits::max_depth / 2 - 2}) {
    json blocks = nested_residual(levels);
    blocks.push_back(simple("flatten"));
    blocks.push_back({{"type", "linear"}, {"out_features", 2}});
    const std::string name = "residual_nested_" + std::to_string(levels);
    out.emplace_back(name, spec(name.c_str(), json::array({4, 6, 6}), 2, blocks));
  }
  return out;
}

// Inputs that once failed: each must now be refused with a core::error (the fuzzer runs every
// seed first, so a regression fails the fuzz test at once).
const std::pair<const char*, const char*> regressions[] = {
    // A number too large for a double: nlohmann's out_of_range escaped the parser.
    {"regress_number_overflow", R"({"input": [8], "classes": 8, "blocks": [{"type": "relu", "p": 1e400}]})"},
    // 2^24 input channels x a 2^20 x 2^20 kernel: counting the weights overflowed int64.
    {"regress_conv_weights_overflow",
     R"({"input": [1, 1, 1], "classes": 2, "blocks": [{"type": "conv2d", "out_channels": 16777216, "kernel": 1},)"
     R"( {"type": "conv2d", "out_channels": 1, "kernel": 1048576, "stride": 16777216, "padding": 16777216},)"
     R"( {"type": "flatten"}, {"type": "linear", "out_features": 2}]})"},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<char> stream;
  for (auto& [name, builder] : transport::testing::sample_messages()) {
    const auto frame = builder.frame();
    if (!write_frame(dir + "/" + name + ".frame", builder)) return 1;
    stream.insert(stream.end(), reinterpret_cast<const char*>(frame.data()),
                  reinterpret_cast<const char*>(frame.data()) + frame.size());
  }
  if (!write(dir + "/all.stream", stream)) return 1;
  // Encoded step tensors (f16, bf16, int8 scales, topk positions): the codec checks' paths.
  for (auto& [name, builder] : transport::testing::encoded_step_messages())
    if (!write_frame(dir + "/" + name + ".frame", builder)) return 1;

  // Model specs: every seed must be accepted, so that mutations start from the deepest paths.
  std::vector<std::pair<std::string, std::string>> specs;
  try {
    const std::pair<core::shape, int> inputs[] = {{{1, 28, 28}, 10}, {{3, 32, 32}, 100}};
    for (const auto& zoo : core::zoo_names())
      for (const auto& [input, classes] : inputs)
        specs.emplace_back("zoo_" + zoo + "_" + std::to_string(input[0]), core::zoo_model(zoo, input, classes).json);
    specs.emplace_back("zoo_mlp_flat", core::zoo_model("mlp", {784}, 10).json);
    for (const auto& [name, j] : nested_specs()) specs.emplace_back(name, j.dump(2));
    for (const auto& [name, text] : specs) (void)core::parse_model_spec(text, name);
  } catch (const core::error& e) {
    std::fprintf(stderr, "make_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  for (const auto& [name, text] : specs) {
    if (!write(dir + "/" + name + ".json", text)) return 1;
    const auto m = core::parse_model_spec(text, name);
    if (!write_frame(dir + "/Plan_" + name + ".frame", plan_with(m.json, static_cast<std::uint32_t>(m.n_blocks()))))
      return 1;
  }
  for (const auto& [name, text] : regressions)
    if (!write(dir + "/" + name + ".json", std::string_view(text))) return 1;
  return 0;
}
