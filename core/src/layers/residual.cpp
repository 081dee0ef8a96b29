// The residual block: y = act(body(x) + shortcut(x)), a composite with an inside graph.
#include "layers.h"

namespace cleave::core::layers {

namespace {

class residual final : public layer {
 public:
  residual(const shape& in, std::vector<std::unique_ptr<layer>> body, std::vector<std::unique_ptr<layer>> shortcut,
           bool relu_after)
      : layer(in, body.back()->output_shape()),
        body_(std::move(body)),
        shortcut_(std::move(shortcut)),
        relu_after_(relu_after) {}

  std::string kind() const override { return "residual"; }

  std::vector<param_spec> params() const override { return collect(&layer::params, "params"); }
  std::vector<param_spec> buffers() const override { return collect(&layer::buffers, "buffers"); }

  void bind(std::span<const tensor> p, std::span<const tensor> g, std::span<const tensor> s) override {
    std::size_t ip = 0, is = 0;
    for_each_inner([&](layer& l, const std::string&) {
      const std::size_t np = l.params().size(), ns = l.buffers().size();
      l.bind(p.subspan(ip, np), g.subspan(ip, np), s.subspan(is, ns));
      ip += np;
      is += ns;
    });
  }

  tensor forward(backend& b, const tensor& x, layer_ctx& ctx, const run_info& info) override {
    // x (N, in...) -> y (N, out...)
    ctx.children.resize(body_.size() + shortcut_.size());
    // Evaluating, nothing is kept for a backward: each inner layer's context goes at once.
    const bool eval = info.mode == mode::eval;
    tensor h = x;
    for (std::size_t i = 0; i < body_.size(); ++i) {
      h = body_[i]->forward(b, h, ctx.children[i], sub(info, i));
      if (eval) ctx.children[i] = {};
    }
    tensor s = x;
    for (std::size_t i = 0; i < shortcut_.size(); ++i) {
      s = shortcut_[i]->forward(b, s, ctx.children[body_.size() + i], sub(info, body_.size() + i));
      if (eval) ctx.children[body_.size() + i] = {};
    }
    tensor y = b.empty(h.shape());
    b.add(h, s, y);
    if (relu_after_) {
      b.relu_forward(y, y);
      ctx.saved = {y};
    }
    return y;
  }

  tensor backward(backend& b, const tensor& dy, layer_ctx& ctx, bool need_dx) override {
    tensor d = dy;
    if (relu_after_) {
      d = b.empty(dy.shape());
      b.relu_backward(ctx.saved[0], dy, d);
    }
    tensor dh = d;
    for (std::size_t i = body_.size(); i-- > 0;) dh = body_[i]->backward(b, dh, ctx.children[i], need_dx || i > 0);
    tensor ds = d;
    for (std::size_t i = shortcut_.size(); i-- > 0;)
      ds = shortcut_[i]->backward(b, ds, ctx.children[body_.size() + i], need_dx || i > 0);
    if (!need_dx) return {};
    tensor dx = b.empty(dh.shape());
    b.add(dh, ds, dx);
    return dx;
  }

  double flops_per_sample() const override {
    double f = static_cast<double>(out_.numel()) * (relu_after_ ? 2.0 : 1.0);
    for (const auto& l : body_) f += l->flops_per_sample();
    for (const auto& l : shortcut_) f += l->flops_per_sample();
    return f;
  }

 private:
  template <class F>
  void for_each_inner(F f) const {
    for (std::size_t i = 0; i < body_.size(); ++i) f(*body_[i], "body." + std::to_string(i) + ".");
    for (std::size_t i = 0; i < shortcut_.size(); ++i) f(*shortcut_[i], "shortcut." + std::to_string(i) + ".");
  }

  std::vector<param_spec> collect(std::vector<param_spec> (layer::*get)() const, const char*) const {
    std::vector<param_spec> out;
    for_each_inner([&](const layer& l, const std::string& prefix) {
      for (auto p : (l.*get)()) {
        p.name = prefix + p.name;
        out.push_back(std::move(p));
      }
    });
    return out;
  }

  // Each inner layer draws its own randomness.
  static run_info sub(const run_info& info, std::size_t i) {
    run_info r = info;
    r.seed = info.seed ^ (0x9e3779b9u * static_cast<std::uint32_t>(i + 1));
    return r;
  }

  std::vector<std::unique_ptr<layer>> body_, shortcut_;
  bool relu_after_;
};

}  // namespace

std::unique_ptr<layer> make_residual(const shape& in, std::vector<std::unique_ptr<layer>> body,
                                     std::vector<std::unique_ptr<layer>> shortcut, bool relu_after) {
  if (body.empty()) throw error("residual body must have at least one layer");
  const shape body_out = body.back()->output_shape();
  const shape short_out = shortcut.empty() ? in : shortcut.back()->output_shape();
  if (!(body_out == short_out))
    throw error("residual body output " + body_out.str() + " does not match shortcut output " + short_out.str() +
                (shortcut.empty() ? " (identity shortcut: add a 'shortcut' with a 1x1 conv2d)" : ""));
  return std::make_unique<residual>(in, std::move(body), std::move(shortcut), relu_after);
}

}  // namespace cleave::core::layers
