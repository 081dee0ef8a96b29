// The subcommands of `cleave`: each registers itself on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace cleave::apps {

void register_train_commands(CLI::App& app);     // train, eval, backends, models
void register_export_command(CLI::App& app);     // export (safetensors)
void register_certs_command(CLI::App& app);      // certs init / issue / renew / revoke
void register_provision_command(CLI::App& app);  // provision (startup kits)
void register_node_commands(CLI::App& app);      // server, edge, agent, demo

}  // namespace cleave::apps
