// The configuration files of every command (--config FILE): TOML read with toml++ and handed to
// CLI11 key by key, so that a syntax error, a key set twice, an unknown key or an unknown section
// is an error naming the file, the line and the key instead of being skipped.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace cleave::apps {

class strict_toml : public CLI::Config {
 public:
  // Throws CLI::ConfigError("line N: ...") on the first line that is not TOML, or whose value is
  // not a string, number, boolean or one-line array of them.
  std::vector<CLI::ConfigItem> from_config(std::istream& in) const override;
  std::string to_config(const CLI::App* app, bool defaults, bool comments, std::string prefix) const override;
  // CLI11's error about an item no option took ("INI was not able to parse server.rouns"), as
  // "line 2: unknown key 'rouns' in [server]" (or an unknown section); other messages unchanged.
  std::string explain(const std::string& message, const CLI::App& app) const;
  // "line N: " of the key ("section.key", or "key" outside any section) in the last file read;
  // "" when it was not there.
  std::string where(const std::string& key) const {
    const auto it = lines_.find(key);
    return it == lines_.end() ? "" : "line " + std::to_string(it->second) + ": ";
  }

 private:
  mutable std::map<std::string, int> lines_;  // "section.key" -> its line
};

// The whole error for a bad configuration file: "config 'FILE': line N: ...".
std::string config_error(const CLI::App& app, const strict_toml& f, const CLI::ConfigError& e);

// Every floating-point option given (flag or file) must be finite: NaN and inf pass CLI11's
// range checks. Throws CLI::ValidationError naming the option.
void require_finite_numbers(const CLI::App& app);

}  // namespace cleave::apps
