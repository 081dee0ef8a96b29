// Configuration files read with toml++: the document parsed as TOML, then handed to CLI11 as
// [section] key = value items; errors phrased for the user and mapped back to their lines.
#include "config_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "toml_text.h"

namespace cleave::apps {

namespace {

[[noreturn]] void bad(int line, const std::string& what) {
  throw CLI::ConfigError("line " + std::to_string(line) + ": " + what);
}

// One value as the text CLI11 reads into an option; `key` and the line name it in errors.
std::string text_of(const toml::node& v, const std::string& key) {
  if (const auto* s = v.as_string()) return s->get();
  if (const auto* i = v.as_integer()) return std::to_string(i->get());
  if (const auto* b = v.as_boolean()) return b->get() ? "true" : "false";
  if (const auto* f = v.as_floating_point()) {
    const double x = f->get();
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    return fmt::format("{}", x);
  }
  bad(line_of(v), "'" + key + "' is not a string, a number, true or false, or an array of them");
}

// Every key of t (under `parents`) as CLI11's items, each with its line; lines["section.key"] too.
void read(const toml::table& t, const std::vector<std::string>& parents,
          std::vector<std::pair<int, CLI::ConfigItem>>& out, std::map<std::string, int>& lines_) {
  const std::string prefix = parents.empty() ? "" : CLI::detail::join(parents, ".") + ".";
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    const int at = static_cast<int>(k.source().begin.line);
    CLI::ConfigItem item;
    item.parents = parents;
    item.name = key;
    if (const auto* sub = v.as_table(); sub && !sub->is_inline()) {
      // A [section]: its own item, so that CLI11 names a section no command has.
      item.parents.push_back(key);
      item.name = "++";
      lines_.emplace(prefix + key + ".++", line_of(v));
      out.emplace_back(line_of(v), item);
      read(*sub, item.parents, out, lines_);
      continue;
    }
    if (const auto* a = v.as_array()) {
      for (const auto& x : *a) item.inputs.push_back(text_of(x, key));
    } else {
      item.inputs.push_back(text_of(v, key));
    }
    lines_[prefix + key] = at;
    out.emplace_back(at, std::move(item));
  }
}

}  // namespace

std::vector<CLI::ConfigItem> strict_toml::from_config(std::istream& in) const {
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  lines_.clear();
  toml::table root;
  try {
    root = parse_toml(doc);
  } catch (const toml_error& e) {
    bad(e.line, e.what());
  }
  std::vector<std::pair<int, CLI::ConfigItem>> items;
  read(root, {}, items, lines_);
  // In the file's order: the first unknown key CLI11 meets is the first in the file.
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<CLI::ConfigItem> out;
  for (auto& [line, item] : items) out.push_back(std::move(item));
  return out;
}

std::string strict_toml::to_config(const CLI::App* app, bool defaults, bool comments, std::string prefix) const {
  return CLI::ConfigTOML().to_config(app, defaults, comments, std::move(prefix));
}

std::string strict_toml::explain(const std::string& message, const CLI::App& app) const {
  const std::string prefix = "INI was not able to parse ";
  if (message.rfind(prefix, 0) != 0) return message;
  const std::string full = message.substr(prefix.size());
  const auto it = lines_.find(full);
  const std::string at = it == lines_.end() ? "" : "line " + std::to_string(it->second) + ": ";
  const auto dot = full.rfind('.');
  if (dot == std::string::npos) return at + "unknown key '" + full + "' outside any [section]";
  const std::string section = full.substr(0, dot), key = full.substr(dot + 1);
  if (key == "++") return at + "unknown section [" + section + "]";
  const auto known = app.get_subcommands([&](const CLI::App* a) { return a->get_name() == section; });
  if (known.empty()) return at + "unknown section [" + section + "]";
  return at + "unknown key '" + key + "' in [" + section + "] (see cleave " + section + " --help)";
}

std::string config_error(const CLI::App& app, const strict_toml& f, const CLI::ConfigError& e) {
  const auto* opt = app.get_config_ptr();
  const std::string file = opt && opt->count() ? opt->as<std::string>() : "";
  return "config '" + file + "': " + f.explain(e.what(), app);
}

void require_finite_numbers(const CLI::App& app) {
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_type_name().rfind("FLOAT", 0) != 0) continue;
    for (const auto& r : o->results()) {
      char* end = nullptr;
      const double v = std::strtod(r.c_str(), &end);
      if (end != r.c_str() && !std::isfinite(v))
        throw CLI::ValidationError(o->get_name(), "'" + r + "' is not a finite number");
    }
  }
  for (const CLI::App* sub : app.get_subcommands()) require_finite_numbers(*sub);
}

}  // namespace cleave::apps
