// Renaming a checkpoint's tensors to PyTorch's state_dict names (the table is in the header).
#include "cleave/core/torch_export.h"

#include <algorithm>
#include <optional>

#include "cleave/core/error.h"

namespace cleave::core {

namespace {

using renames = std::map<std::string, std::string>;  // cleave module path -> torch module path

// The zoo's module names, or none for a model the zoo did not make.
std::optional<renames> zoo_renames(const model_spec& m) {
  const auto names = zoo_names();
  if (std::find(names.begin(), names.end(), m.name) == names.end()) return std::nullopt;
  if (zoo_model(m.name, m.input, m.n_classes).json != m.json) return std::nullopt;
  if (m.name == "mlp") return renames{{"1", "fc1"}, {"3", "fc2"}, {"5", "fc3"}};
  if (m.name == "lenet5") return renames{{"0", "conv1"}, {"3", "conv2"}, {"7", "fc1"}, {"9", "fc2"}, {"11", "fc3"}};
  if (m.name == "vgg11-bn") {
    // features.N is block N (the same Sequential order); the linear after flatten is classifier.
    renames r{{std::to_string(m.n_blocks() - 1), "classifier"}};
    for (int b = 0; b + 2 < m.n_blocks(); ++b) r[std::to_string(b)] = "features." + std::to_string(b);
    return r;
  }
  // A zoo model without a torch layout here yet keeps cleave's names (see the header).
  if (m.name != "resnet8" && m.name != "resnet18") return std::nullopt;
  // Stem conv1, bn1 (blocks 0, 1), basic blocks from block 3 on, then the pool and fc.
  const int per_stage = m.name == "resnet8" ? 1 : 2, n_basic = 4 * per_stage - (m.name == "resnet8" ? 1 : 0);
  renames r{{"0", "conv1"}, {"1", "bn1"}, {std::to_string(3 + n_basic + 1), "fc"}};
  for (int k = 0; k < n_basic; ++k) {
    const std::string from = std::to_string(3 + k) + ".",
                      to = "layer" + std::to_string(k / per_stage + 1) + "." + std::to_string(k % per_stage) + ".";
    r[from + "body.0"] = to + "conv1";
    r[from + "body.1"] = to + "bn1";
    r[from + "body.3"] = to + "conv2";
    r[from + "body.4"] = to + "bn2";
    r[from + "shortcut.0"] = to + "downsample.0";
    r[from + "shortcut.1"] = to + "downsample.1";
  }
  return r;
}

std::string renamed(const std::optional<renames>& r, const std::string& name) {
  if (!r) return name;
  const auto dot = name.rfind('.');
  CLEAVE_ASSERT(dot != std::string::npos, "a tensor name has a module and a leaf");
  const auto it = r->find(name.substr(0, dot));
  CLEAVE_ASSERT(it != r->end(), "every zoo tensor has a torch name");
  return it->second + name.substr(dot);
}

std::vector<std::int64_t> dims_of(const shape& s) {
  std::vector<std::int64_t> d;
  for (int i = 0; i < s.rank(); ++i) d.push_back(s[i]);
  return d;
}

}  // namespace

std::string torch_name(const model_spec& m, const std::string& name) {
  return renamed(zoo_renames(m), name);
}

torch_state torch_state_dict(const checkpoint& c, const model_spec& m, const std::string& source) {
  const auto r = zoo_renames(m);
  torch_state out;
  auto take = [&](const std::string& prefix, const std::string& name, const shape& expected) {
    const checkpoint::entry* e = c.find(prefix + name);
    if (!e)
      throw error("checkpoint '" + source + "': no tensor '" + prefix + name + "' of model '" + m.name +
                  "' (a checkpoint of another model?)");
    if (!(e->dims == expected))
      throw error("checkpoint '" + source + "': tensor '" + prefix + name + "' has shape " + e->dims.str() +
                  ", model '" + m.name + "' has " + expected.str() + " (a checkpoint of another model?)");
    out.tensors.push_back(safetensor::f32(renamed(r, name), dims_of(e->dims), e->values));
  };
  const auto blocks = build_blocks(m, 0, m.n_blocks());
  const std::int64_t steps = c.step;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::string block = std::to_string(i) + ".";
    for (const auto& p : blocks[i]->params()) take("p:", block + p.name, p.shape);
    for (const auto& b : blocks[i]->buffers()) {
      take("s:", block + b.name, b.shape);
      const std::string full = block + b.name, leaf = ".running_var";
      if (full.ends_with(leaf)) {  // a batch norm
        const std::string module = full.substr(0, full.size() - leaf.size());
        out.tensors.push_back(safetensor::i64(renamed(r, module + ".num_batches_tracked"), {}, std::span(&steps, 1)));
      }
    }
  }
  out.metadata = {{"format", "pt"},
                  {"model", m.name},
                  {"model_spec", m.json},
                  {"epoch", std::to_string(c.epoch)},
                  {"step", std::to_string(c.step)},
                  {"seed", std::to_string(c.seed)}};
  // How its inputs were normalised in training, where the checkpoint says.
  for (const char* key : {"input_mean", "input_std"})
    if (const auto it = c.meta.find(key); it != c.meta.end()) out.metadata[key] = it->second;
  return out;
}

}  // namespace cleave::core
