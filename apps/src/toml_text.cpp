// TOML through toml++ for cleave's files: toml++'s parse errors said in cleave's words (the ones
// its hand-written readers used), with the line; one-line values checked after the parse.
#include "toml_text.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace cleave::apps {

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::string nth_line(const std::string& doc, int n) {
  std::istringstream in(doc);
  std::string l;
  for (int i = 1; i <= n && std::getline(in, l); ++i) {
  }
  return l;
}

// The last line before `before` on which a key or table named `key` is set in t (0: none).
int last_set(const toml::table& t, const std::string& key, int before) {
  int found = 0;
  for (const auto& [k, v] : t) {
    const int at = line_of(k);
    if (k.str() == key && at < before) found = std::max(found, at);
    if (const auto* sub = v.as_table()) found = std::max(found, last_set(*sub, key, before));
    if (const auto* arr = v.as_array())
      for (const auto& x : *arr)
        if (const auto* sub = x.as_table()) found = std::max(found, last_set(*sub, key, before));
  }
  return found;
}

[[noreturn]] void syntax_error(const std::string& doc, const toml::parse_error& e) {
  const int n = static_cast<int>(e.source().begin.line);
  const std::string desc(e.description());
  const std::string l = nth_line(doc, n);
  const auto has = [&](const char* what) { return desc.find(what) != std::string::npos; };
  if (has("redefine existing")) {
    // The name toml++ quotes last; where it was first set, from the lines before this one.
    const auto close = desc.rfind('\''), open = close == 0 ? std::string::npos : desc.rfind('\'', close - 1);
    const std::string key = open == std::string::npos ? "" : desc.substr(open + 1, close - open - 1);
    int first = 0;
    try {
      std::string before, one;
      std::istringstream lines(doc);
      for (int i = 1; i < n && std::getline(lines, one); ++i) before += one + "\n";
      first = last_set(toml::parse(before), key, n);
    } catch (const toml::parse_error&) {
      first = 0;
    }
    const std::string what = has("table header") ? "section [" + key + "]" : "'" + key + "'";
    throw toml_error(n, what + " is set twice" + (first ? " (first on line " + std::to_string(first) + ")" : ""));
  }
  if (has("table header") && has("expected ']'")) throw toml_error(n, "a section header without ']': " + trim(l));
  if (has("key-value pair") && has("expected '='"))
    throw toml_error(n, "expected KEY = VALUE or [SECTION], got '" + trim(l) + "'");
  if (has("parsing string") && (has("control characters") || has("end-of-file")))
    throw toml_error(n, "a string that does not close: " + trim(l.substr(std::min(l.size(), l.find_first_of("\"'")))));
  if (has("parsing array")) throw toml_error(n, "an array must close on its line, with values separated by commas");
  if (has("could not determine value type") || has("parsing boolean") || has("parsing integer") ||
      has("parsing floating-point") || has("parsing date") || has("parsing time")) {
    // The word the value was meant to be: from the separator before the error's column to the next.
    auto from = std::min(l.size(), static_cast<std::size_t>(std::max<int>(1, e.source().begin.column) - 1));
    while (from > 0 && std::string(" \t=,[").find(l[from - 1]) == std::string::npos) --from;
    const auto to = l.find_first_of(" \t,]#", from + 1);
    const std::string word = l.substr(from, to == std::string::npos ? std::string::npos : to - from);
    throw toml_error(n, "'" + trim(word) + "' is not a string, a number, true or false (strings need quotes)");
  }
  throw toml_error(n, desc);
}

// Every value on the line of its key: arrays close where they open.
void check_one_line(const toml::table& t) {
  for (const auto& [k, v] : t) {
    if (const auto* sub = v.as_table(); sub && !sub->is_inline()) {
      check_one_line(*sub);
    } else if (const auto* arr = v.as_array(); arr && arr->is_array_of_tables()) {
      for (const auto& x : *arr) check_one_line(*x.as_table());
    } else if (v.source().begin.line != v.source().end.line) {
      throw toml_error(line_of(k), "an array must close on its line");
    }
  }
}

}  // namespace

int line_of(const toml::node& n) {
  return static_cast<int>(n.source().begin.line);
}

int line_of(const toml::key& k) {
  return static_cast<int>(k.source().begin.line);
}

toml::table parse_toml(const std::string& doc) {
  toml::table root;
  try {
    root = toml::parse(doc);
  } catch (const toml::parse_error& e) {
    syntax_error(doc, e);
  }
  check_one_line(root);
  return root;
}

std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const toml::table& t) {
  std::vector<std::pair<const toml::key*, const toml::node*>> out;
  for (const auto& [k, v] : t) out.emplace_back(&k, &v);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.first->source().begin.line < b.first->source().begin.line;
  });
  return out;
}

std::string toml_value_text(const toml::node& v) {
  if (const auto* s = v.as_string()) {
    std::string out = "\"";
    for (const char c : s->get()) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char u[8];
        std::snprintf(u, sizeof u, "\\u%04x", static_cast<unsigned>(c));
        out += u;
      } else {
        out += c;
      }
    }
    return out + "\"";
  }
  if (const auto* a = v.as_array()) {
    std::string out = "[";
    for (std::size_t i = 0; i < a->size(); ++i) out += (i ? ", " : "") + toml_value_text((*a)[i]);
    return out + "]";
  }
  std::ostringstream out;
  v.visit([&](const auto& x) { out << x; });
  return out.str();
}

}  // namespace cleave::apps
