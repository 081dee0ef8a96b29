// A checkpoint's model under the names, shapes and dtypes of the PyTorch state_dict of the same
// architecture, for `cleave export` to write as safetensors.
//
// cleave names a tensor "<block>.<layer name>" ("3.body.0.weight"); a checkpoint holds the
// parameters as "p:<name>" and the batch-norm statistics as "s:<name>". cleave's layouts are
// PyTorch's, so nothing is transposed: conv2d weight (out,in,kh,kw), linear weight (out,in),
// biases (out); batch norm weight, bias, running_mean, running_var (C), running_var unbiased
// as PyTorch keeps it. Every batch norm also gets num_batches_tracked, an I64 scalar: the
// optimizer steps of the checkpoint. Optimizer state and anything else is left out.
//
// Zoo models, by cleave block (scripts/export_check.py defines the matching torch modules):
//   mlp      flatten, 1 fc1, relu, 3 fc2, relu, 5 fc3
//   lenet5   0 conv1, relu, maxpool, 3 conv2, relu, maxpool, flatten, 7 fc1, relu, 9 fc2,
//            relu, 11 fc3
//   resnet8  0 conv1, 1 bn1, relu, 3 layer1.0, 4 layer2.0, 5 layer3.0, global pool, 7 fc;
//            inside a residual block as torchvision's BasicBlock: body.0 conv1, body.1 bn1,
//            body.3 conv2, body.4 bn2, shortcut.0 downsample.0, shortcut.1 downsample.1
//   resnet18 0 conv1, 1 bn1, relu, 3..10 layer1.0, layer1.1, layer2.0, ..., layer4.1 (inside as
//            resnet8's), global pool, 12 fc
//   vgg11-bn N features.N for every conv, batch norm, relu and pool block (the same order as
//            torch's nn.Sequential `features`), flatten, last block classifier
// A zoo name whose spec differs from the zoo's (a .json spec file), or a zoo model not in this
// table, keeps cleave's names: the state_dict of an nn.Sequential of its blocks, a residual
// block holding nn.Sequential `body` and `shortcut`.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cleave/core/checkpoint.h"
#include "cleave/core/model.h"
#include "cleave/core/safetensors.h"

namespace cleave::core {

struct torch_state {
  std::vector<safetensor> tensors;
  std::map<std::string, std::string> metadata;  // format "pt", the model and where it comes from
};

// The tensors of model `m` from checkpoint `c`. Throws naming `source` (the checkpoint's file)
// when a tensor of the model is missing or has another shape.
torch_state torch_state_dict(const checkpoint& c, const model_spec& m, const std::string& source);

// The PyTorch name of cleave tensor `name` ("3.body.0.weight") of model `m`.
std::string torch_name(const model_spec& m, const std::string& name);

}  // namespace cleave::core
