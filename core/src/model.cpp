// Model specs: JSON parsing with errors that name the block and field, the zoo, building blocks.
#include "cleave/core/model.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "layers/layers.h"

namespace cleave::core {

namespace {

using json = nlohmann::json;

// Reads typed fields of one block, remembering which were used to reject unknown ones.
class fields {
 public:
  explicit fields(const json& j) : j_(j) {}

  std::int64_t integer(const char* name, std::optional<std::int64_t> fallback = std::nullopt) {
    used_.insert(name);
    if (!j_.contains(name)) {
      if (fallback) return *fallback;
      throw error(std::string("field '") + name + "': missing (an integer is required)");
    }
    const json& v = j_.at(name);
    if (!v.is_number_integer()) throw error(std::string("field '") + name + "': must be an integer, got " + v.dump());
    const auto x = v.get<std::int64_t>();
    if (x < -spec_limits::max_field || x > spec_limits::max_field)
      throw error(std::string("field '") + name + "': " + v.dump() + " is out of range (at most " +
                  std::to_string(spec_limits::max_field) + ")");
    return x;
  }
  // An integer or a pair [h, w].
  std::pair<int, int> pair(const char* name, std::optional<int> fallback = std::nullopt) {
    used_.insert(name);
    if (!j_.contains(name)) {
      if (fallback) return {*fallback, *fallback};
      throw error(std::string("field '") + name + "': missing (an integer or [h, w] is required)");
    }
    const json& v = j_.at(name);
    if (v.is_number_integer()) return {checked_int(name, v), checked_int(name, v)};
    if (v.is_array() && v.size() == 2 && v[0].is_number_integer() && v[1].is_number_integer())
      return {checked_int(name, v[0]), checked_int(name, v[1])};
    throw error(std::string("field '") + name + "': must be an integer or [h, w], got " + v.dump());
  }
  bool has(const char* name) const { return j_.contains(name); }
  double number(const char* name, double fallback) {
    used_.insert(name);
    if (!j_.contains(name)) return fallback;
    const json& v = j_.at(name);
    if (!v.is_number()) throw error(std::string("field '") + name + "': must be a number, got " + v.dump());
    return v.get<double>();
  }
  bool boolean(const char* name, bool fallback) {
    used_.insert(name);
    if (!j_.contains(name)) return fallback;
    const json& v = j_.at(name);
    if (!v.is_boolean()) throw error(std::string("field '") + name + "': must be true or false, got " + v.dump());
    return v.get<bool>();
  }
  const json* array(const char* name, bool required) {
    used_.insert(name);
    if (!j_.contains(name)) {
      if (required) throw error(std::string("field '") + name + "': missing (a list of blocks is required)");
      return nullptr;
    }
    const json& v = j_.at(name);
    if (!v.is_array()) throw error(std::string("field '") + name + "': must be a list of blocks");
    return &v;
  }
  void reject_unknown() const {
    for (const auto& [k, v] : j_.items())
      if (k != "type" && !used_.count(k)) throw error("field '" + k + "': unknown for this block type");
  }

 private:
  static int checked_int(const char* name, const json& v) {
    const auto x = v.get<std::int64_t>();
    if (x < -(1 << 20) || x > (1 << 20)) throw error(std::string("field '") + name + "': out of range: " + v.dump());
    return static_cast<int>(x);
  }
  const json& j_;
  std::set<std::string> used_;
};

// Layers parsed so far, nested ones included, against spec_limits::max_layers.
struct layer_budget {
  int n = 0;
};

std::unique_ptr<layer> parse_block(const json& j, const shape& in, const std::string& where, layer_budget& lb);

std::vector<std::unique_ptr<layer>> parse_chain(const json& list, shape in, const std::string& where,
                                                layer_budget& lb) {
  std::vector<std::unique_ptr<layer>> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    out.push_back(parse_block(list[i], in, where + "[" + std::to_string(i) + "]", lb));
    in = out.back()->output_shape();
  }
  return out;
}

// The number of values a shape holds (per sample, for an activation), without overflow.
double values_of(const shape& s) {
  double n = 1;
  for (int i = 0; i < s.rank(); ++i) n *= static_cast<double>(s[i]);
  return n;
}

std::unique_ptr<layer> parse_block(const json& j, const shape& in, const std::string& where, layer_budget& lb) {
  if (++lb.n > spec_limits::max_layers)
    throw error(where + ": more than " + std::to_string(spec_limits::max_layers) + " layers (nested ones included)");
  if (!j.is_object()) throw error(where + ": must be an object with a 'type'");
  if (!j.contains("type") || !j["type"].is_string())
    throw error(where + ": field 'type': missing (a string is required)");
  const std::string type = j["type"].get<std::string>();
  const std::string here = where + " (" + printable(type, 64) + ")";
  try {
    fields f(j);
    std::unique_ptr<layer> l;
    if (type == "conv2d") {
      const auto out = f.integer("out_channels");
      const auto [kh, kw] = f.pair("kernel");
      const auto stride = static_cast<int>(f.integer("stride", 1));
      const auto pad = static_cast<int>(f.integer("padding", 0));
      const auto groups = static_cast<int>(f.integer("groups", 1));
      l = layers::make_conv2d(in, out, kh, kw, stride, pad, f.boolean("bias", true), groups);
      // Checked before the layer counts its weights or FLOPs (C*R*S would overflow int64).
      if (values_of(shape{in[0], kh, kw}) > static_cast<double>(spec_limits::max_params))
        throw error("field 'kernel': " + std::to_string(kh) + "x" + std::to_string(kw) + " over " +
                    std::to_string(in[0]) + " input channels is more than the limit of " +
                    std::to_string(spec_limits::max_params) + " weights per output channel");
    } else if (type == "linear") {
      l = layers::make_linear(in, f.integer("out_features"), f.boolean("bias", true));
    } else if (type == "maxpool2d" || type == "avgpool2d") {
      const auto [kh, kw] = f.pair("kernel");
      const auto [sh, sw] = f.has("stride") ? f.pair("stride") : std::pair{kh, kw};
      const auto [ph, pw] = f.pair("padding", 0);
      l = layers::make_pool2d(in, {type == "maxpool2d" ? pool_kind::max : pool_kind::avg, kh, kw, sh, sw, ph, pw});
    } else if (type == "global_avg_pool") {
      l = layers::make_global_avg_pool(in);
    } else if (type == "relu") {
      l = layers::make_relu(in);
    } else if (type == "relu6") {
      l = layers::make_clamp(in, 0.0f, 6.0f);
    } else if (type == "clamp") {
      l = layers::make_clamp(in, static_cast<float>(f.number("min", 0.0)), static_cast<float>(f.number("max", 6.0)));
    } else if (type == "flatten") {
      l = layers::make_flatten(in);
    } else if (type == "dropout") {
      l = layers::make_dropout(in, static_cast<float>(f.number("p", 0.5)));
    } else if (type == "batchnorm2d") {
      l = layers::make_batchnorm2d(in, static_cast<float>(f.number("eps", 1e-5)),
                                   static_cast<float>(f.number("momentum", 0.1)));
    } else if (type == "residual") {
      auto body = parse_chain(*f.array("body", true), in, here + ": body", lb);
      std::vector<std::unique_ptr<layer>> shortcut;
      if (const json* s = f.array("shortcut", false)) shortcut = parse_chain(*s, in, here + ": shortcut", lb);
      l = layers::make_residual(in, std::move(body), std::move(shortcut), f.boolean("relu", true));
    } else {
      throw error("unknown block type '" + printable(type, 64) +
                  "' (known: conv2d, linear, maxpool2d, avgpool2d, global_avg_pool, relu, relu6, clamp, flatten, "
                  "dropout, batchnorm2d, residual)");
    }
    f.reject_unknown();
    if (values_of(l->output_shape()) > static_cast<double>(spec_limits::max_sample_values))
      throw error("outputs " + l->output_shape().str() + " per sample, more than the limit of " +
                  std::to_string(spec_limits::max_sample_values) + " values");
    return l;
  } catch (const error& e) {
    const std::string msg = e.what();
    // Nested blocks already carry their location.
    if (msg.rfind(here, 0) == 0 || msg.find(": body[") != std::string::npos ||
        msg.find(": shortcut[") != std::string::npos)
      throw;
    throw error(here + ": " + msg);
  }
}

shape parse_shape(const json& v) {
  if (!v.is_array() || v.empty() || v.size() > 3) throw error("field 'input': must be [C, H, W] or [F]");
  shape s;
  if (v.size() == 1)
    s = shape{0};
  else if (v.size() == 2)
    throw error("field 'input': must be [C, H, W] or [F]");
  else
    s = shape{0, 0, 0};
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer() || v[i].get<std::int64_t>() < 1 || v[i].get<std::int64_t>() > (1 << 20))
      throw error("field 'input': dimensions must be positive integers, got " + v.dump());
    s[static_cast<int>(i)] = v[i].get<std::int64_t>();
  }
  if (values_of(s) > static_cast<double>(spec_limits::max_sample_values))
    throw error("field 'input': " + v.dump() + " is more than the limit of " +
                std::to_string(spec_limits::max_sample_values) + " values per sample");
  return s;
}

}  // namespace

std::int64_t model_spec::n_params() const {
  std::int64_t n = 0;
  for (const auto& b : blocks) n += b.n_params;
  return n;
}

namespace {

std::int64_t total(const std::vector<param_spec>& specs) {
  std::int64_t n = 0;
  for (const auto& p : specs) n += p.shape.numel();
  return n;
}

// Parameters of a layer, without overflow.
double n_values(const std::vector<param_spec>& specs) {
  double n = 0;
  for (const auto& p : specs) n += values_of(p.shape);
  return n;
}

struct parsed {
  json root;
  shape input;
  int n_classes = 0;
  int label_groups = 1;
};

parsed parse_root(std::string_view text, std::string_view source) {
  const std::string prefix = "model spec '" + std::string(source) + "': ";
  parsed p;
  try {
    // Nesting is bounded while parsing: deeper specs would overflow the stack of every recursive
    // walk over them.
    p.root = json::parse(text, [](int depth, json::parse_event_t, json&) {
      if (depth > spec_limits::max_depth)
        throw error("nested deeper than " + std::to_string(spec_limits::max_depth) + " levels");
      return true;
    });
  } catch (const error& e) {
    throw error(prefix + e.what());
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number too large for a double (1e400).
    throw error(prefix + "not valid JSON: " + e.what());
  }
  if (!p.root.is_object()) throw error(prefix + "must be a JSON object");
  try {
    for (const auto& [k, v] : p.root.items())
      if (k != "name" && k != "input" && k != "classes" && k != "blocks" && k != "label_groups")
        throw error("field '" + k + "': unknown (expected name, input, classes, label_groups, blocks)");
    if (!p.root.contains("input")) throw error("field 'input': missing");
    p.input = parse_shape(p.root["input"]);
    // (read as 64 bits: an int would wrap 4294967298 to 2)
    if (!p.root.contains("classes") || !p.root["classes"].is_number_integer() ||
        p.root["classes"].get<std::int64_t>() < 2 || p.root["classes"].get<std::int64_t>() > 1000000)
      throw error("field 'classes': missing or not an integer from 2 to 1000000");
    p.n_classes = p.root["classes"].get<int>();
    if (p.root.contains("label_groups")) {
      const json& g = p.root["label_groups"];
      if (!g.is_number_integer() || g.get<std::int64_t>() < 1 || g.get<std::int64_t>() > 1024)
        throw error("field 'label_groups': not an integer from 1 to 1024");
      p.label_groups = g.get<int>();
      if (static_cast<std::int64_t>(p.n_classes) * p.label_groups > 1000000)
        throw error("fields 'classes' and 'label_groups': more than 1000000 outputs");
    }
    if (!p.root.contains("blocks") || !p.root["blocks"].is_array() || p.root["blocks"].empty())
      throw error("field 'blocks': missing or not a non-empty list");
    if (p.root.contains("name") && !p.root["name"].is_string()) throw error("field 'name': must be a string");
  } catch (const error& e) {
    throw error(prefix + e.what());
  }
  return p;
}

}  // namespace

model_spec parse_model_spec(std::string_view text, std::string_view source) {
  const parsed p = parse_root(text, source);
  const std::string prefix = "model spec '" + std::string(source) + "': ";
  model_spec m;
  m.name = p.root.value("name", std::string(source));
  m.input = p.input;
  m.n_classes = p.n_classes;
  m.label_groups = p.label_groups;
  m.json = p.root.dump();
  shape in = m.input;
  const json& blocks = p.root["blocks"];
  layer_budget lb;
  double n_params = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    std::unique_ptr<layer> l;
    try {
      l = parse_block(blocks[i], in, "block " + std::to_string(i), lb);
    } catch (const error& e) {
      throw error(prefix + e.what());
    }
    n_params += n_values(l->params()) + n_values(l->buffers());
    if (n_params > static_cast<double>(spec_limits::max_params))
      throw error(prefix + fmt::format("block {}: the model would hold more than {:.4g} parameters and buffers "
                                       "({:.1f} GiB as f32; the limit is {} = {:.1f} GiB)",
                                       i, n_params, n_params * 4 / (1 << 30), spec_limits::max_params,
                                       static_cast<double>(spec_limits::max_params) * 4 / (1 << 30)));
    m.blocks.push_back({l->kind(), l->input_shape(), l->output_shape(), total(l->params()), total(l->buffers()),
                        l->flops_per_sample()});
    in = l->output_shape();
  }
  const std::int64_t outputs = static_cast<std::int64_t>(m.n_classes) * m.label_groups;
  if (!(in == shape{outputs}))
    throw error(prefix + "block " + std::to_string(blocks.size() - 1) + " (" + m.blocks.back().kind + "): outputs " +
                in.str() + " but the model has " + std::to_string(m.n_classes) + " classes" +
                (m.label_groups > 1 ? " in " + std::to_string(m.label_groups) + " label groups" : std::string()) +
                ": the last block must output (" + std::to_string(outputs) + ")");
  return m;
}

model_spec with_label_groups(const model_spec& m, int groups) {
  if (groups < 1 || groups > 1024)
    throw error("label groups " + std::to_string(groups) + ": must be an integer from 1 to 1024");
  if (groups == 1) return m;
  const std::string prefix = "model '" + m.name + "' with " + std::to_string(groups) + " label groups: ";
  if (m.label_groups != 1) throw error(prefix + "it has " + std::to_string(m.label_groups) + " label groups already");
  json root = json::parse(m.json);
  json& last = root["blocks"].back();
  if (!last.is_object() || last.value("type", std::string()) != "linear")
    throw error(prefix + "its last block is " + m.blocks.back().kind + ", not the linear layer it needs to widen");
  last["out_features"] = static_cast<std::int64_t>(m.n_classes) * groups;
  root["label_groups"] = groups;
  return parse_model_spec(root.dump(), m.name);
}

flat_layout layout_of(const model_spec& m) {
  flat_layout l;
  l.param_offset.push_back(0);
  l.buffer_offset.push_back(0);
  for (const auto& b : m.blocks) {
    l.param_offset.push_back(l.param_offset.back() + b.n_params);
    l.buffer_offset.push_back(l.buffer_offset.back() + b.n_buffers);
  }
  return l;
}

model_spec load_model_spec_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw error("model spec '" + path + "': cannot open file");
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse_model_spec(ss.str(), path);
}

std::vector<std::unique_ptr<layer>> build_blocks(const model_spec& m, int begin, int end) {
  CLEAVE_ASSERT(0 <= begin && begin <= end && end <= m.n_blocks(), "block range out of the model");
  const json root = json::parse(m.json);
  layer_budget lb;
  std::vector<std::unique_ptr<layer>> out;
  for (int i = begin; i < end; ++i)
    out.push_back(parse_block(root["blocks"][static_cast<std::size_t>(i)], m.blocks[static_cast<std::size_t>(i)].in,
                              "block " + std::to_string(i), lb));
  return out;
}

}  // namespace cleave::core
