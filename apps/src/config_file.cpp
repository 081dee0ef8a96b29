// Strict TOML configuration: a line-by-line check of the subset CLI11 reads, then CLI11's own
// reader; unknown keys and sections mapped back to their lines.
#include "config_file.h"

#include <cctype>
#include <cmath>
#include <regex>
#include <sstream>

namespace cleave::apps {

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

[[noreturn]] void bad(int line, const std::string& what) {
  throw CLI::ConfigError("line " + std::to_string(line) + ": " + what);
}

// The end of the string starting at s[i] (a quote), past its closing quote; npos if unclosed.
std::size_t string_end(const std::string& s, std::size_t i) {
  const char q = s[i];
  for (std::size_t j = i + 1; j < s.size(); ++j) {
    if (q == '"' && s[j] == '\\') {
      ++j;
      continue;
    }
    if (s[j] == q) return j + 1;
  }
  return std::string::npos;
}

// Checks one scalar value (a string, number or boolean); returns where it ends in s.
std::size_t scalar_end(const std::string& s, std::size_t i, int line) {
  if (s[i] == '"' || s[i] == '\'') {
    const auto e = string_end(s, i);
    if (e == std::string::npos) bad(line, "a string that does not close: " + s.substr(i));
    return e;
  }
  std::size_t e = i;
  while (e < s.size() && s[e] != ',' && s[e] != ']' && s[e] != '#' && s[e] != ' ' && s[e] != '\t') ++e;
  const std::string word = s.substr(i, e - i);
  static const std::regex number(R"([+-]?(\d[\d_]*(\.\d+)?([eE][+-]?\d+)?|inf|nan))");
  if (word != "true" && word != "false" && !std::regex_match(word, number))
    bad(line, "'" + word + "' is not a string, a number, true or false (strings need quotes)");
  return e;
}

// What is left after a value must be blank or a comment.
void expect_end(const std::string& s, std::size_t i, int line) {
  const std::string rest = trim(s.substr(std::min(i, s.size())));
  if (!rest.empty() && rest[0] != '#') bad(line, "unexpected '" + rest + "' after the value");
}

void check_value(const std::string& v, int line) {
  if (v.empty()) bad(line, "a key without a value");
  if (v[0] != '[') return expect_end(v, scalar_end(v, 0, line), line);
  std::size_t i = 1;
  for (bool first = true;; first = false) {
    while (i < v.size() && (v[i] == ' ' || v[i] == '\t')) ++i;
    if (i >= v.size()) bad(line, "an array must close on its line");
    if (v[i] == ']' && first) break;
    i = scalar_end(v, i, line);
    while (i < v.size() && (v[i] == ' ' || v[i] == '\t')) ++i;
    if (i < v.size() && v[i] == ',') {
      ++i;
      continue;
    }
    if (i < v.size() && v[i] == ']') break;
    bad(line, "an array must close on its line, with values separated by commas");
  }
  expect_end(v, i + 1, line);
}

}  // namespace

std::vector<CLI::ConfigItem> strict_toml::from_config(std::istream& in) const {
  static const std::regex name(R"([A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*)");
  std::stringstream text;
  text << in.rdbuf();
  lines_.clear();
  std::string section, raw;
  std::istringstream lines(text.str());
  for (int n = 1; std::getline(lines, raw); ++n) {
    const std::string l = trim(raw);
    if (l.empty() || l[0] == '#') continue;
    if (l[0] == '[') {
      const auto close = l.find(']');
      if (close == std::string::npos) bad(n, "a section header without ']': " + l);
      section = trim(l.substr(1, close - 1));
      if (!std::regex_match(section, name)) bad(n, "bad section name '" + section + "'");
      expect_end(l, close + 1, n);
      lines_.emplace(section + ".++", n);  // CLI11's item for a section it cannot place
      continue;
    }
    const auto eq = l.find('=');
    if (eq == std::string::npos) bad(n, "expected KEY = VALUE or [SECTION], got '" + l + "'");
    const std::string key = trim(l.substr(0, eq));
    if (!std::regex_match(key, name)) bad(n, "bad key '" + key + "'");
    check_value(trim(l.substr(eq + 1)), n);
    const std::string full = section.empty() ? key : section + "." + key;
    if (const auto it = lines_.find(full); it != lines_.end())
      bad(n, "'" + key + "' is set twice (first on line " + std::to_string(it->second) + ")");
    lines_[full] = n;
  }
  std::istringstream again(text.str());
  return CLI::ConfigTOML::from_config(again);
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
