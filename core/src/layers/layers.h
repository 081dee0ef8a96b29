// Constructors of the built-in layers. Each validates its per-sample input shape and its
// settings and throws core::error with a message naming the offending setting.
#pragma once

#include <memory>
#include <vector>

#include "cleave/core/layer.h"

namespace cleave::core::layers {

std::unique_ptr<layer> make_linear(const shape& in, std::int64_t out_features, bool bias);
// groups divides the input channels and out_channels (groups == both: depthwise).
std::unique_ptr<layer> make_conv2d(const shape& in, std::int64_t out_channels, int kernel_h, int kernel_w, int stride,
                                   int padding, bool bias, int groups = 1);
std::unique_ptr<layer> make_pool2d(const shape& in, const pool2d_desc& d);
std::unique_ptr<layer> make_global_avg_pool(const shape& in);
std::unique_ptr<layer> make_relu(const shape& in);
// y = min(max(x, lo), hi), finite lo < hi; ReLU6 is (0, 6).
std::unique_ptr<layer> make_clamp(const shape& in, float lo, float hi);
std::unique_ptr<layer> make_flatten(const shape& in);
std::unique_ptr<layer> make_dropout(const shape& in, float p);
std::unique_ptr<layer> make_batchnorm2d(const shape& in, float eps, float momentum);
// y = act(body(x) + shortcut(x)); an empty shortcut is the identity.
std::unique_ptr<layer> make_residual(const shape& in, std::vector<std::unique_ptr<layer>> body,
                                     std::vector<std::unique_ptr<layer>> shortcut, bool relu_after);

}  // namespace cleave::core::layers
