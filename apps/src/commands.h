// The subcommands of `cleave`: each registers itself on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "cleave/core/dataset.h"
#include "cleave/split/aggregator.h"
#include "option_table.h"

namespace cleave::apps {

// `--augment [LIST]` of the commands that train (train, agent, demo), read into `a`: bare, the
// usual CIFAR recipe crop:4,flip; or a list as core::parse_augment reads it.
CLI::Option* add_augment_option(CLI::App* c, core::augment_config& a);
extern const char* const augment_help;

// The same as an option of a table whose settings S hold the augmentation at `field`.
template <class S, class F>
option<S> augment_option(F field) {
  auto o = parsed<S>(
      "augment", "[LIST]", augment_help, [field](S& s, const std::string& v) { field(s) = core::parse_augment(v); },
      [field](const S& s) {
        const auto& a = field(const_cast<S&>(s));
        return a.any() ? std::vector<std::string>{core::augment_str(a)} : std::vector<std::string>{};
      });
  o.more = [](CLI::Option* opt) { opt->expected(0, 1)->default_str("crop:4,flip"); };
  return o;
}

void register_train_commands(CLI::App& app);     // train, eval, backends
void register_models_command(CLI::App& app);     // models (the zoo, one model's blocks)
void register_export_command(CLI::App& app);     // export (safetensors)
void register_certs_command(CLI::App& app);      // certs init / issue / renew / revoke
void register_provision_command(CLI::App& app);  // provision (startup kits)
void register_node_commands(CLI::App& app);      // server, edge, agent, demo
void register_job_command(CLI::App& app);        // job (a long-running server's queue, cmd_job.cpp)
void register_demo_command(CLI::App& app);       // demo (cmd_demo.cpp)
std::vector<option_doc> demo_option_docs();      // the demo's options as the docs list them
std::vector<option_doc> train_option_docs();     // train's (cmd_train.cpp)
void register_options_command(CLI::App& app);    // options (the reference, cmd_options.cpp)

// Shared by the node commands and the demo (cmd_nodes.cpp). "vulkan,onednn" -> backend specs,
// each built into this binary and usable here; --aggregate RULE -> the typed rule. Both name
// the option in errors.
std::vector<std::string> parse_backend_list(const std::string& s, const char* option);
split::aggregate_rule parse_aggregate_option(const std::string& s);

}  // namespace cleave::apps
