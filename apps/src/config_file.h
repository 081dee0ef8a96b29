// The configuration files of every command (--config FILE): TOML as CLI11 reads it, checked line
// by line first, so that a syntax error, a key set twice, an unknown key or an unknown section is
// an error naming the file, the line and the key instead of being skipped.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

namespace cleave::apps {

class strict_toml : public CLI::ConfigTOML {
 public:
  // Throws CLI::ConfigError("line N: ...") on the first line that is not a comment, a [section]
  // or KEY = VALUE (a string, number, boolean or one-line array).
  std::vector<CLI::ConfigItem> from_config(std::istream& in) const override;
  // CLI11's error about an item no option took ("INI was not able to parse server.rouns"), as
  // "line 2: unknown key 'rouns' in [server]" (or an unknown section); other messages unchanged.
  std::string explain(const std::string& message, const CLI::App& app) const;

 private:
  mutable std::map<std::string, int> lines_;  // "section.key" -> its line
};

// The whole error for a bad configuration file: "config 'FILE': line N: ...".
std::string config_error(const CLI::App& app, const strict_toml& f, const CLI::ConfigError& e);

// Every floating-point option given (flag or file) must be finite: NaN and inf pass CLI11's
// range checks. Throws CLI::ValidationError naming the option.
void require_finite_numbers(const CLI::App& app);

}  // namespace cleave::apps
