// Models: a chain of blocks written as a JSON spec or taken from the zoo by name.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cleave/core/layer.h"

namespace cleave::core {

struct block_info {
  std::string kind;            // "conv2d", "residual", ...
  shape in, out;               // per-sample shapes
  std::int64_t n_params = 0;   // trainable elements
  std::int64_t n_buffers = 0;  // state elements (running statistics)
  double flops = 0.0;          // forward FLOPs per sample
};

struct model_spec {
  std::string name;
  shape input;  // per sample, (C,H,W) or (F)
  int n_classes = 0;
  // Label groups G (JSON "label_groups", default 1): the last block outputs n_classes * G
  // logits, G interchangeable sub-classes per class (logits c*G .. c*G+G-1 are class c's). A
  // training step targets one sub-class of each sample's class drawn at random (see
  // core/stage.h); evaluation, reported losses and accuracy use the class logits,
  // log-sum-exp over each group. G = 1 is the plain classifier.
  int label_groups = 1;
  std::string json;  // the spec as compact JSON (travels to other nodes as is)
  std::vector<block_info> blocks;

  int n_blocks() const { return static_cast<int>(blocks.size()); }
  std::int64_t n_params() const;
};

// Where each block's parameters and state sit in the model's flat buffers (the concatenation
// of all blocks in order; a stage of blocks [b, e) holds the slice [offset[b], offset[e])).
struct flat_layout {
  std::vector<std::int64_t> param_offset;   // n_blocks + 1 entries
  std::vector<std::int64_t> buffer_offset;  // n_blocks + 1 entries
};
flat_layout layout_of(const model_spec& m);

// Limits of a spec, local or from the network, checked while parsing and before anything is
// allocated: JSON nesting, layers (nested ones included), parameters, values per sample.
struct spec_limits {
  static constexpr int max_depth = 64;
  static constexpr int max_layers = 10000;
  static constexpr std::int64_t max_params = std::int64_t{1} << 30;         // 4 GiB of f32
  static constexpr std::int64_t max_sample_values = std::int64_t{1} << 28;  // any tensor, per sample
  static constexpr std::int64_t max_field = std::int64_t{1} << 24;          // widths, channels, kernels
};

// Parses and validates a spec. `source` names it in errors (e.g. the file name). Errors name
// the block and the field: "model spec 'net.json': block 3 (conv2d): field 'kernel': ...".
model_spec parse_model_spec(std::string_view json_text, std::string_view source = "<text>");
model_spec load_model_spec_file(const std::string& path);
// m with `groups` label groups: its last block, a linear layer with n_classes outputs, widened
// to n_classes * groups (groups 1: m as is). Errors name what keeps m from it.
model_spec with_label_groups(const model_spec& m, int groups);

// Built-in models for a per-sample input shape and a class count (input channels come from the
// shape; 1x28x28 Fashion-MNIST and 3x32x32 CIFAR both work):
//   mlp       flatten, 256, 128, classes
//   lenet5    LeCun et al. 1998 with ReLU and max pooling
//   resnet8   CIFAR-style ResNet, 16/32/64 channels, one basic block per stage
//   resnet18  He et al. 2016 ResNet-18 with the CIFAR stem (3x3 conv stride 1, no max pool),
//             64/128/256/512 channels, two basic blocks per stage, each one block; 11,173,962
//             parameters on 3x32x32 with 10 classes, as torchvision's layout of it
//   vgg11-bn  VGG-11 with batch norm, CIFAR classifier (flatten, one linear 512 -> classes);
//             a max pool that would take a side below 1 is left out (the fifth on 28x28)
//   mobilenetv2  Sandler et al. 2018, CIFAR-style strides (1 in the stem and the second
//             stage), depthwise 3x3 convs and ReLU6; "mobilenetv2:W" for width multiplier W;
//             2,236,682 parameters on 3x32x32 with 10 classes, as torchvision's
std::vector<std::string> zoo_names();
model_spec zoo_model(std::string_view name, const shape& input, int n_classes);

// A zoo name, or a path to a .json spec (whose input and classes must then match).
model_spec resolve_model(std::string_view name_or_path, const shape& input, int n_classes);

// Constructs blocks [begin, end) of the model (parameters not yet bound).
std::vector<std::unique_ptr<layer>> build_blocks(const model_spec& m, int begin, int end);

}  // namespace cleave::core
