// Reading cleave's TOML files (configurations, projects) with toml++: the parse, with the first
// error phrased for the user and its line, and the keys of a table in the order they are written.
#pragma once

#include <toml++/toml.h>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cleave::apps {

// A document that is not TOML (or not the one-line values cleave's files are written in).
struct toml_error : std::runtime_error {
  toml_error(int at, const std::string& what) : std::runtime_error(what), line(at) {}
  int line;
};

// Throws toml_error at the first bad line: a section header without ']', a key set twice, a
// value that is not a string, number or boolean, a string or array that does not close...
toml::table parse_toml(const std::string& doc);

int line_of(const toml::node& n);
int line_of(const toml::key& k);

// The keys of t with their values, in the order the file has them.
std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const toml::table& t);

// A value as TOML writes it ("text" quoted, numbers, arrays), to copy into another file.
std::string toml_value_text(const toml::node& v);

}  // namespace cleave::apps
