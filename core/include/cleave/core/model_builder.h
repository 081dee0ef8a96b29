// Writing a model in C++: a builder that emits the JSON spec parse_model_spec reads (the same
// schema as a spec file), so a built model is exactly the model that spec describes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cleave/core/model.h"
#include "cleave/core/shape.h"

namespace cleave::core {

// A kernel, stride or padding: (h, w), or one number for both.
struct size2 {
  int h = 0, w = 0;
  size2(int both) : h(both), w(both) {}  // NOLINT: implicit, so that 3 reads as 3x3
  size2(int h_, int w_) : h(h_), w(w_) {}
};

// The layer calls shared by a model and the body or shortcut of a residual block. Every call
// appends one block and writes each of its fields into the spec (defaults included), except a
// pool's stride when none is given (the parser's default: the kernel).
template <class self>
class layer_calls {
 public:
  // (C,H,W) -> (out_channels, H', W'); stride and padding the same on both axes; groups divides
  // C and out_channels (both equal to groups: depthwise).
  self& conv2d(int out_channels, size2 kernel, int stride = 1, int padding = 0, bool bias = true, int groups = 1) {
    return add(conv2d_json(out_channels, kernel, stride, padding, bias, groups));
  }
  self& linear(int out_features, bool bias = true) { return add(linear_json(out_features, bias)); }
  self& batchnorm2d(double eps = 1e-5, double momentum = 0.1) { return add(batchnorm2d_json(eps, momentum)); }
  self& maxpool2d(size2 kernel, std::optional<size2> stride = std::nullopt, size2 padding = 0) {
    return add(pool_json("maxpool2d", kernel, stride, padding));
  }
  self& avgpool2d(size2 kernel, std::optional<size2> stride = std::nullopt, size2 padding = 0) {
    return add(pool_json("avgpool2d", kernel, stride, padding));
  }
  self& relu() { return add(R"({"type":"relu"})"); }
  self& relu6() { return add(R"({"type":"relu6"})"); }
  self& clamp(double min, double max) { return add(clamp_json(min, max)); }
  self& flatten() { return add(R"({"type":"flatten"})"); }
  self& global_avg_pool() { return add(R"({"type":"global_avg_pool"})"); }
  self& dropout(double p = 0.5) { return add(dropout_json(p)); }
  // out = relu?(body(x) + shortcut(x)); an empty shortcut is the identity.
  template <class body_t, class shortcut_t>
  self& residual(const layer_calls<body_t>& body, const layer_calls<shortcut_t>& shortcut, bool relu = true) {
    return add(residual_json(body.blocks_, &shortcut.blocks_, relu));
  }
  template <class body_t>
  self& residual(const layer_calls<body_t>& body, bool relu = true) {
    return add(residual_json(body.blocks_, nullptr, relu));
  }

  // The blocks of `chain`, each a block of its own here.
  template <class chain_t>
  self& append(const layer_calls<chain_t>& chain) {
    for (const auto& b : chain.blocks_) add(b);
    return static_cast<self&>(*this);
  }

  int n_blocks() const { return static_cast<int>(blocks_.size()); }
  // The blocks as a JSON array, compact.
  std::string blocks_json() const;

 protected:
  std::vector<std::string> blocks_;  // one compact JSON object each

 private:
  template <class>
  friend class layer_calls;
  self& add(std::string block) {
    blocks_.push_back(std::move(block));
    return static_cast<self&>(*this);
  }
  static std::string conv2d_json(int out_channels, size2 kernel, int stride, int padding, bool bias, int groups);
  static std::string clamp_json(double min, double max);
  static std::string linear_json(int out_features, bool bias);
  static std::string batchnorm2d_json(double eps, double momentum);
  static std::string pool_json(const char* type, size2 kernel, std::optional<size2> stride, size2 padding);
  static std::string dropout_json(double p);
  static std::string residual_json(const std::vector<std::string>& body, const std::vector<std::string>* shortcut,
                                   bool relu);
};

// The inside of a residual block: layer_chain().conv2d(16, 3, 1, 1, false).batchnorm2d().relu()
class layer_chain : public layer_calls<layer_chain> {};
extern template class layer_calls<layer_chain>;

// model_builder b("har", {3, 1, 128}, 6);
// b.conv2d(32, {1, 5}, 1, 0).relu().maxpool2d({1, 2}).flatten().linear(6);
// model_spec m = b.build();  // what parse_model_spec(b.json(), "har") gives
class model_builder : public layer_calls<model_builder> {
 public:
  // input: per sample, (C,H,W) or (F); n_classes: what the last block must output.
  model_builder(std::string name, shape input, int n_classes);

  // The spec as JSON text, what a spec file would hold.
  std::string json() const;
  // Parses and checks json() as a spec file is, errors naming the model: a setting that would
  // be wrong in a file is wrong here, with the same message.
  model_spec build() const;

 private:
  std::string name_;
  shape input_;
  int n_classes_;
};
extern template class layer_calls<model_builder>;

}  // namespace cleave::core
