// The model builder's JSON: each layer call's block, and the whole spec handed to the parser.
#include "cleave/core/model_builder.h"

#include <nlohmann/json.hpp>

namespace cleave::core {

namespace {

using json = nlohmann::json;

json pair_json(size2 s) {
  if (s.h == s.w) return s.h;
  return json::array({s.h, s.w});
}

json chain_json(const std::vector<std::string>& blocks) {
  json a = json::array();
  for (const auto& b : blocks) a.push_back(json::parse(b));
  return a;
}

}  // namespace

template <class self>
std::string layer_calls<self>::blocks_json() const {
  return chain_json(blocks_).dump();
}

template <class self>
std::string layer_calls<self>::conv2d_json(int out_channels, size2 kernel, int stride, int padding, bool bias,
                                           int groups) {
  json j{{"type", "conv2d"}, {"out_channels", out_channels}, {"kernel", pair_json(kernel)},
         {"stride", stride}, {"padding", padding},           {"bias", bias}};
  if (groups != 1) j["groups"] = groups;
  return j.dump();
}

template <class self>
std::string layer_calls<self>::clamp_json(double min, double max) {
  return json{{"type", "clamp"}, {"min", min}, {"max", max}}.dump();
}

template <class self>
std::string layer_calls<self>::linear_json(int out_features, bool bias) {
  return json{{"type", "linear"}, {"out_features", out_features}, {"bias", bias}}.dump();
}

template <class self>
std::string layer_calls<self>::batchnorm2d_json(double eps, double momentum) {
  return json{{"type", "batchnorm2d"}, {"eps", eps}, {"momentum", momentum}}.dump();
}

template <class self>
std::string layer_calls<self>::pool_json(const char* type, size2 kernel, std::optional<size2> stride, size2 padding) {
  json j{{"type", type}, {"kernel", pair_json(kernel)}, {"padding", pair_json(padding)}};
  if (stride) j["stride"] = pair_json(*stride);
  return j.dump();
}

template <class self>
std::string layer_calls<self>::dropout_json(double p) {
  return json{{"type", "dropout"}, {"p", p}}.dump();
}

template <class self>
std::string layer_calls<self>::residual_json(const std::vector<std::string>& body,
                                             const std::vector<std::string>* shortcut, bool relu) {
  json j{{"type", "residual"}, {"body", chain_json(body)}, {"relu", relu}};
  if (shortcut && !shortcut->empty()) j["shortcut"] = chain_json(*shortcut);
  return j.dump();
}

// The layer calls of the two users, instantiated here so that the JSON code stays in this file.
template class layer_calls<layer_chain>;
template class layer_calls<model_builder>;

model_builder::model_builder(std::string name, shape input, int n_classes)
    : name_(std::move(name)), input_(input), n_classes_(n_classes) {}

std::string model_builder::json() const {
  nlohmann::json in = nlohmann::json::array();
  for (int i = 0; i < input_.rank(); ++i) in.push_back(input_[i]);
  return nlohmann::json{{"name", name_}, {"input", in}, {"classes", n_classes_}, {"blocks", chain_json(blocks_)}}
      .dump();
}

model_spec model_builder::build() const {
  return parse_model_spec(json(), name_);
}

}  // namespace cleave::core
