// Job files read with the server's option table, restricted to the per-run options.
#include "job_file.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "cleave/core/error.h"
#include "cleave/core/model.h"
#include "config_file.h"
#include "node_options.h"

namespace cleave::apps {

const std::vector<std::string>& job_keys() {
  static const std::vector<std::string> keys = {"model",
                                                "data",
                                                "dataset",
                                                "mode",
                                                "u-shape",
                                                "cuts",
                                                "edge-cuts",
                                                "rounds",
                                                "local-steps",
                                                "batch",
                                                "micro-batches",
                                                "codecs",
                                                "min-devices",
                                                "deadline",
                                                "join-timeout",
                                                "seed",
                                                "optimizer",
                                                "lr",
                                                "lr-schedule",
                                                "warmup-rounds",
                                                "momentum",
                                                "weight-decay",
                                                "aggregate",
                                                "keep-checkpoints",
                                                "eval-every",
                                                "eval-samples",
                                                "stop-at-accuracy",
                                                "no-adapt",
                                                "min-device-blocks",
                                                "label-groups",
                                                "secure-aggregation",
                                                "secagg-min-holders",
                                                "min-gain",
                                                "repay-rounds",
                                                "schedule"};
  return keys;
}

namespace {

// The option an error message names first ("--rounds: ..."), as a key of the file.
std::string key_named(const std::string& message) {
  const auto at = message.find("--");
  if (at == std::string::npos) return {};
  const auto end = message.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-", at + 2);
  return message.substr(at + 2, end == std::string::npos ? std::string::npos : end - at - 2);
}

}  // namespace

server::server_config job_settings(const server::server_config& base, const std::string& text,
                                   const std::string& file) {
  server::server_config c = base;
  CLI::App app("job file");
  auto toml = std::make_shared<strict_toml>();
  app.config_formatter(toml);
  app.allow_config_extras(CLI::config_extras_mode::error);
  option_table<server::server_config> table;
  const auto& keys = job_keys();
  for (const auto& o : server_options())
    if (std::find(keys.begin(), keys.end(), o.name) != keys.end()) table.push_back(o);
  add_options(app, table, c);
  const std::string where = "job file '" + file + "': ";
  try {
    std::istringstream in(text);
    app.parse_from_stream(in);
    require_finite_numbers(app);
  } catch (const CLI::ConfigError& e) {
    std::string why = toml->explain(e.what(), app);
    // A server option that is not per run: the server's own setting, not the job's.
    const auto& all = server_options();
    for (const auto& o : all)
      if (why.find("unknown key '" + o.name + "'") != std::string::npos)
        why += " (a setting of the server itself, not of a job)";
    throw core::error(where + why);
  } catch (const std::exception& e) {
    const std::string key = key_named(e.what());
    throw core::error(where + (key.empty() ? "" : toml->where(key)) + e.what());
  }
  // A model the server could not load fails here, not when the job's turn comes.
  const auto zoo = core::zoo_names();
  if (!c.model_spec && std::find(zoo.begin(), zoo.end(), c.model) == zoo.end() && !std::filesystem::exists(c.model))
    throw core::error(where + toml->where("model") + "model '" + c.model +
                      "' is neither a zoo model nor a spec file on the server (cleave models lists the zoo)");
  c.state_dir.clear();
  c.job_file.clear();
  return c;
}

}  // namespace cleave::apps
