// The model zoo: built-in specs, generated for the data set's input shape and class count.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>

#include "cleave/core/model.h"

namespace cleave::core {

namespace {

using json = nlohmann::json;

json conv(int out, int k, int stride, int pad, bool bias) {
  return {{"type", "conv2d"}, {"out_channels", out}, {"kernel", k},
          {"stride", stride}, {"padding", pad},      {"bias", bias}};
}
json simple(const char* type) {
  return {{"type", type}};
}
json linear(int out) {
  return {{"type", "linear"}, {"out_features", out}};
}
json maxpool(int k) {
  return {{"type", "maxpool2d"}, {"kernel", k}};
}

// Basic residual block: two 3x3 convs with batch norm; a 1x1 projection when the shape changes.
json basic_block(int in, int out, int stride) {
  json body = json::array({conv(out, 3, stride, 1, false), simple("batchnorm2d"), simple("relu"),
                           conv(out, 3, 1, 1, false), simple("batchnorm2d")});
  json b = {{"type", "residual"}, {"body", body}, {"relu", true}};
  if (stride != 1 || in != out) b["shortcut"] = json::array({conv(out, 1, stride, 0, false), simple("batchnorm2d")});
  return b;
}

json conv_bn(int out, int k, int stride, int groups) {
  json c = conv(out, k, stride, k / 2, false);
  if (groups != 1) c["groups"] = groups;
  return c;
}

// Channels times the width multiplier, rounded to a multiple of 8 and never more than 10%
// below the exact value (torchvision's _make_divisible).
int make_divisible(double v) {
  int r = std::max(8, static_cast<int>(v + 4.0) / 8 * 8);
  if (r < 0.9 * v) r += 8;
  return r;
}

// MobileNetV2's inverted residual (Sandler et al. 2018): 1x1 expansion (skipped for t = 1),
// 3x3 depthwise with the stride, 1x1 linear projection, each with batch norm and the first two
// with ReLU6. With stride 1 and equal widths the input is added back (one residual block);
// otherwise the layers are blocks of their own (more places to cut, the same function).
void inverted_residual(json& blocks, int in, int out, int stride, int t) {
  const int hidden = in * t;
  json body = json::array();
  if (t != 1) body.insert(body.end(), {conv_bn(hidden, 1, 1, 1), simple("batchnorm2d"), simple("relu6")});
  body.insert(body.end(), {conv_bn(hidden, 3, stride, hidden), simple("batchnorm2d"), simple("relu6"),
                           conv_bn(out, 1, 1, 1), simple("batchnorm2d")});
  if (stride == 1 && in == out) {
    blocks.push_back({{"type", "residual"}, {"body", body}, {"relu", false}});
  } else {
    for (auto& l : body) blocks.push_back(l);
  }
}

// MobileNetV2 for small images (CIFAR-style: stride 1 in the stem and in the second stage, so a
// 32x32 input ends at 4x4), with a width multiplier.
json mobilenetv2(double width, int n_classes) {
  // (expansion t, channels c, repeats n, first stride s), as in the paper's Table 2.
  const int settings[][4] = {{1, 16, 1, 1}, {6, 24, 2, 1},  {6, 32, 3, 2}, {6, 64, 4, 2},
                             {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
  json blocks = json::array();
  int in = make_divisible(32 * width);
  blocks.insert(blocks.end(), {conv_bn(in, 3, 1, 1), simple("batchnorm2d"), simple("relu6")});
  for (const auto& st : settings) {
    const int out = make_divisible(st[1] * width);
    for (int i = 0; i < st[2]; ++i) {
      inverted_residual(blocks, in, out, i == 0 ? st[3] : 1, st[0]);
      in = out;
    }
  }
  const int last = width > 1.0 ? make_divisible(1280 * width) : 1280;
  blocks.insert(blocks.end(), {conv_bn(last, 1, 1, 1), simple("batchnorm2d"), simple("relu6"),
                               simple("global_avg_pool"), linear(n_classes)});
  return blocks;
}

// He et al. 2016 ResNet-18 with the CIFAR stem (3x3 conv, stride 1, no max pool): four stages
// of two basic blocks, each block one top-level block (the splitter's unit), as torchvision's
// BasicBlock layout names them (export maps block 3 + 2*(stage-1) + j to layer<stage>.<j>).
json resnet18(int n_classes) {
  json blocks = {conv(64, 3, 1, 1, false), simple("batchnorm2d"), simple("relu")};
  int in = 64;
  for (const int width : {64, 128, 256, 512}) {
    for (int j = 0; j < 2; ++j) {
      blocks.push_back(basic_block(in, width, j == 0 && width != 64 ? 2 : 1));
      in = width;
    }
  }
  blocks.push_back(simple("global_avg_pool"));
  blocks.push_back(linear(n_classes));
  return blocks;
}

// VGG-11 with batch norm, CIFAR style: [64,M,128,M,256,256,M,512,512,M,512,512,M], every conv
// 3x3 pad 1 + batch norm + ReLU, then flatten and one linear layer. A 2x2 max pool that would
// take a side below 1 is left out: on 28x28 inputs the sides go 28, 14, 7, 3, 1 and the fifth
// pool is dropped, so both 28x28 and 32x32 inputs reach the classifier as 512x1x1.
json vgg11_bn(const shape& input, int n_classes) {
  json blocks = json::array();
  std::int64_t h = input[1], w = input[2];
  for (const int c : {64, -1, 128, -1, 256, 256, -1, 512, 512, -1, 512, 512, -1}) {
    if (c > 0) {
      blocks.push_back(conv(c, 3, 1, 1, true));
      blocks.push_back(simple("batchnorm2d"));
      blocks.push_back(simple("relu"));
    } else if (h >= 2 && w >= 2) {
      blocks.push_back(maxpool(2));
      h /= 2;
      w /= 2;
    }
  }
  blocks.push_back(simple("flatten"));
  blocks.push_back(linear(n_classes));
  return blocks;
}

json input_json(const shape& s) {
  json a = json::array();
  for (int i = 0; i < s.rank(); ++i) a.push_back(s[i]);
  return a;
}

}  // namespace

std::vector<std::string> zoo_names() {
  return {"mlp", "lenet5", "resnet8", "resnet18", "mobilenetv2", "vgg11-bn"};
}

model_spec zoo_model(std::string_view name, const shape& input, int n_classes) {
  json blocks = json::array();
  if (name == "mlp") {
    blocks = {simple("flatten"), linear(256), simple("relu"), linear(128), simple("relu"), linear(n_classes)};
  } else if (name == "lenet5") {
    // LeCun et al. 1998 with ReLU and max pooling (as commonly trained today).
    blocks = {conv(6, 5, 1, 2, true), simple("relu"), maxpool(2),        conv(16, 5, 1, 0, true),
              simple("relu"),         maxpool(2),     simple("flatten"), linear(120),
              simple("relu"),         linear(84),     simple("relu"),    linear(n_classes)};
  } else if (name == "resnet8") {
    // He et al. 2016 CIFAR-style ResNet with one basic block per stage (1 + 3*2 + 1 layers).
    blocks = {conv(16, 3, 1, 1, false),  simple("batchnorm2d"),  simple("relu"),
              basic_block(16, 16, 1),    basic_block(16, 32, 2), basic_block(32, 64, 2),
              simple("global_avg_pool"), linear(n_classes)};
  } else if (name == "mobilenetv2" || name.rfind("mobilenetv2:", 0) == 0) {
    // "mobilenetv2:W" for width multiplier W (default 1).
    double width = 1.0;
    if (name.size() > 12) {
      const std::string w(name.substr(12));
      char* end = nullptr;
      width = std::strtod(w.c_str(), &end);
      if (end != w.c_str() + w.size() || !(width >= 0.125 && width <= 4.0))
        throw error("model '" + std::string(name) + "': the width multiplier must be a number in [0.125, 4]");
    }
    blocks = mobilenetv2(width, n_classes);
  } else if (name == "resnet18") {
    blocks = resnet18(n_classes);
  } else if (name == "vgg11-bn") {
    if (input.rank() != 3) throw error("model 'vgg11-bn' needs image inputs (C,H,W), got " + input.str());
    blocks = vgg11_bn(input, n_classes);
  } else {
    std::string known;
    for (const auto& n : zoo_names()) known += (known.empty() ? "" : ", ") + n;
    std::string hint;
    if (name == "vgg11_bn" || name == "vgg11bn" || name == "vgg11") hint = " (did you mean 'vgg11-bn'?)";
    throw error("unknown model '" + std::string(name) + "'" + hint + " (the zoo has: " + known +
                "; or give a .json spec file)");
  }
  const json spec = {
      {"name", std::string(name)}, {"input", input_json(input)}, {"classes", n_classes}, {"blocks", blocks}};
  return parse_model_spec(spec.dump(), std::string(name));
}

model_spec resolve_model(std::string_view name_or_path, const shape& input, int n_classes) {
  const bool is_file = name_or_path.size() > 5 && name_or_path.substr(name_or_path.size() - 5) == ".json";
  if (!is_file) return zoo_model(name_or_path, input, n_classes);
  model_spec m = load_model_spec_file(std::string(name_or_path));
  if (!(m.input == input))
    throw error("model spec '" + std::string(name_or_path) + "': input " + m.input.str() +
                " does not match the data's " + input.str());
  if (m.n_classes != n_classes)
    throw error("model spec '" + std::string(name_or_path) + "': classes " + std::to_string(m.n_classes) +
                " does not match the data's " + std::to_string(n_classes));
  return m;
}

}  // namespace cleave::core
