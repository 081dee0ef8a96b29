// `cleave models`: the zoo with parameters and FLOPs, and one model's per-block costs (what each
// block holds, computes, outputs across a cut and keeps for backward).
#include <fmt/format.h>

#include <cctype>
#include <optional>

#include "cleave/backend/registry.h"
#include "cleave/core/error.h"
#include "cleave/core/model.h"
#include "cleave/core/stage.h"
#include "commands.h"

namespace cleave::apps {

namespace {

struct models_options {
  std::string name;  // empty: list the zoo
  std::string input;
  int classes = 10;
  bool classes_given = false;
  std::string backend = "auto";
};

// "C,H,W", "CxHxW" or "F" -> a per-sample shape; the error names the text and the form wanted.
core::shape parse_input(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return core::error("--input '" + core::printable(text, 64) + "': " + why +
                       " (expected C,H,W or CxHxW, e.g. 3,32,32 or 1x28x28, or F for flat inputs)");
  };
  std::vector<std::int64_t> dims;
  std::string part;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ',';
    if (c == ',' || c == 'x' || c == 'X') {
      if (part.empty()) throw bad("an empty dimension");
      if (part.size() > 7) throw bad("dimension '" + part + "' is too large");
      dims.push_back(std::stoll(part));
      part.clear();
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      part += c;
    } else {
      throw bad(fmt::format("unexpected character '{}'", core::printable(std::string(1, c), 8)));
    }
  }
  if (dims.size() != 1 && dims.size() != 3) throw bad(fmt::format("{} dimensions", dims.size()));
  for (const auto d : dims)
    if (d < 1 || d > (1 << 20)) throw bad(fmt::format("dimension {} is out of range (1 to 1048576)", d));
  return dims.size() == 1 ? core::shape{dims[0]} : core::shape{dims[0], dims[1], dims[2]};
}

std::string shape_str(const core::shape& s) {
  std::string out;
  for (int i = 0; i < s.rank(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out;
}

std::string flops_str(double f) {
  if (f >= 1e9) return fmt::format("{:.2f} G", f / 1e9);
  if (f >= 1e6) return fmt::format("{:.2f} M", f / 1e6);
  if (f >= 1e3) return fmt::format("{:.1f} k", f / 1e3);
  return fmt::format("{:.0f}", f);
}

std::string bytes_str(double b) {
  if (b >= 1024.0 * 1024.0) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024.0));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{:.0f} B", b);
}

double total_flops(const core::model_spec& m) {
  double f = 0;
  for (const auto& b : m.blocks) f += b.flops;
  return f;
}

void list_zoo(const models_options& o) {
  const core::shape in = o.input.empty() ? core::shape{1, 28, 28} : parse_input(o.input);
  std::printf("%-12s %6s %12s %12s  %s\n", "model", "blocks", "parameters", "FLOPs/sample", "input");
  for (const auto& n : core::zoo_names()) {
    try {
      const auto m = core::zoo_model(n, in, o.classes);
      std::printf("%-12s %6d %12lld %12s  %s, %d classes\n", n.c_str(), m.n_blocks(),
                  static_cast<long long>(m.n_params()), flops_str(total_flops(m)).c_str(), shape_str(in).c_str(),
                  o.classes);
    } catch (const core::error& e) {  // a model that does not fit this input is listed as such
      std::printf("%-12s %s\n", n.c_str(), core::printable(e.what(), 200).c_str());
    }
  }
}

// Bytes each block's forward keeps for backward, per sample: one training-mode forward of one
// random sample through the whole model on backend `b` (children of residual blocks included).
std::vector<std::uint64_t> saved_bytes(core::backend& b, const core::model_spec& m) {
  core::stage s(b, m, 0, m.n_blocks(), 1);
  const core::tensor x = b.empty(m.input.batched(1));
  std::vector<float> host(static_cast<std::size_t>(m.input.numel()), 0.5f);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 17) / 8.0f - 1.0f;
  b.upload(x, host.data());
  core::stage::context ctx;
  s.forward(x, ctx, core::mode::train);
  b.synchronize();
  const auto count = [](const core::layer_ctx& c, const auto& self) -> std::uint64_t {
    std::uint64_t n = 0;
    for (const auto& t : c.saved)
      if (t.defined()) n += t.bytes();
    for (const auto& child : c.children) n += self(child, self);
    return n;
  };
  std::vector<std::uint64_t> out;
  for (const auto& l : ctx.layers) out.push_back(count(l, count));
  return out;
}

void show_model(const models_options& o) {
  const std::optional<core::shape> given = o.input.empty() ? std::nullopt : std::optional(parse_input(o.input));
  const bool is_file = o.name.size() > 5 && o.name.ends_with(".json");
  core::model_spec m;
  if (is_file) {
    m = core::load_model_spec_file(o.name);
    // A spec fixes its input and classes; flags given must agree with them.
    if (given || o.classes_given)
      m = core::resolve_model(o.name, given.value_or(m.input), o.classes_given ? o.classes : m.n_classes);
  } else {
    m = core::zoo_model(o.name, given.value_or(core::shape{1, 28, 28}), o.classes);
  }
  auto be = backend::make_backend(o.backend);
  const auto saved = saved_bytes(*be, m);
  std::printf("%s on %s, %d classes: %d blocks (saved bytes measured by one training-mode forward on %s)\n",
              m.name.c_str(), shape_str(m.input).c_str(), m.n_classes, m.n_blocks(), be->name().c_str());
  std::printf("%5s  %-16s %-14s %12s %12s %12s %12s\n", "block", "kind", "output", "parameters", "FLOPs/sample",
              "output/smp", "saved/smp");
  std::int64_t params = 0;
  double flops = 0, out_bytes = 0, saved_total = 0;
  for (int i = 0; i < m.n_blocks(); ++i) {
    const auto& b = m.blocks[static_cast<std::size_t>(i)];
    const double ob = static_cast<double>(b.out.numel()) * 4.0;
    const double sb = static_cast<double>(saved[static_cast<std::size_t>(i)]);
    std::printf("%5d  %-16s %-14s %12lld %12s %12s %12s\n", i, b.kind.c_str(), shape_str(b.out).c_str(),
                static_cast<long long>(b.n_params), flops_str(b.flops).c_str(), bytes_str(ob).c_str(),
                bytes_str(sb).c_str());
    params += b.n_params;
    flops += b.flops;
    out_bytes += ob;
    saved_total += sb;
  }
  std::printf("%5s  %-16s %-14s %12lld %12s %12s %12s\n", "total", "", "", static_cast<long long>(params),
              flops_str(flops).c_str(), bytes_str(out_bytes).c_str(), bytes_str(saved_total).c_str());
  std::printf("(parameters %s as f32; output/smp is what crosses a cut after the block, per sample)\n",
              bytes_str(static_cast<double>(params) * 4.0).c_str());
}

}  // namespace

void register_models_command(CLI::App& app) {
  static models_options o;  // lives as long as the app's callbacks
  auto* models = app.add_subcommand(
      "models", "list the model zoo, or show one model's blocks: parameters, FLOPs, bytes at a cut and for backward");
  models->add_option("name", o.name, "a zoo model or a .json spec file (none: list the zoo)");
  models->add_option("--input", o.input, "per-sample input, C,H,W or CxHxW (default 1x28x28; a spec's own)");
  models
      ->add_option_function<int>(
          "--classes",
          [](int k) {
            o.classes = k;
            o.classes_given = true;
          },
          "classes (default 10; a spec's own)")
      ->check(CLI::Range(2, 1000000));
  models->add_option("--backend", o.backend, "backend of the forward that measures saved bytes")->capture_default_str();
  models->callback([] { o.name.empty() ? list_zoo(o) : show_model(o); });
}

}  // namespace cleave::apps
