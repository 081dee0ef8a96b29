// `cleave server`, `cleave edge`, `cleave agent` and `cleave demo`: the split-learning nodes and
// a local federation of them on loopback.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <thread>

#include "cleave/backend/registry.h"
#include "cleave/device/agent.h"
#include "cleave/edge/edge_node.h"
#include "cleave/federation/local_federation.h"
#include "cleave/server/server_node.h"
#include "cleave/transport/certs.h"
#include "cleave/transport/listener.h"
#include "commands.h"
#include "node_options.h"

namespace cleave::apps {

// "vulkan,onednn" -> backend specs, each one built into this binary and usable here; names
// the option and the entry in errors.
std::vector<std::string> parse_backend_list(const std::string& s, const char* option) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  const auto known = backend::list_backends();
  std::size_t from = 0;
  for (;;) {
    const std::size_t comma = s.find(',', from);
    const std::string spec = s.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    const std::string name = spec.substr(0, spec.find(':'));
    const auto it = std::find_if(known.begin(), known.end(), [&](const auto& b) { return b.name == name; });
    if (name.empty() || (name != "auto" && it == known.end()))
      throw core::error(std::string(option) + " '" + s + "': unknown backend '" + spec + "'");
    if (it != known.end() && !it->available)
      throw core::error(std::string(option) + " '" + s + "': backend '" + name + "' is not usable here: " + it->detail);
    out.push_back(spec);
    if (comma == std::string::npos) return out;
    from = comma + 1;
  }
}

// --aggregate RULE -> the typed rule (names the option in errors).
split::aggregate_rule parse_aggregate_option(const std::string& s) {
  try {
    return split::parse_aggregate(s);
  } catch (const core::error& e) {
    throw core::error("--aggregate '" + s + "': " + e.what());
  }
}

namespace {

// A stop signal that arrives while a node is already ending (its signal set gone, the process not
// yet exited) must not kill it with status 143, as it would once Asio gives SIGINT and SIGTERM
// back to their default action. Called once the node's own set holds them, this keeps Asio's
// handler for the rest of the process's life: a second set, on an io_context that never runs,
// takes what arrives after the node's set is gone.
void keep_stop_signals_handled() {
  static auto* const io = new asio::io_context;
  static auto* const held = new asio::signal_set(*io, SIGINT, SIGTERM);
  static_cast<void>(held);
}

void run_server(server::server_config c) {
  server::server_node node(c);
  node.stop_on_signals();
  keep_stop_signals_handled();
  node.run();
  if (!node.checkpoint_failure().empty())
    throw core::error("training finished, but a checkpoint write failed (" + node.checkpoint_failure() + "); '" +
                      c.checkpoint.string() + "' holds the last one written");
}

void run_edge(edge::edge_config c) {
  edge::edge_node node(std::move(c));
  node.stop_on_signals();
  keep_stop_signals_handled();
  node.run();
}

void run_agent(device::agent_config c) {
  if (c.name.empty()) c.name = "device-" + std::to_string(c.id);
  device::agent node(std::move(c));
  node.stop_on_signals();
  keep_stop_signals_handled();
  node.run();
}

// A node command: its options from its table, bound to settings that live as long as the app.
template <class C>
void add_node_command(CLI::App& app, const char* name, const char* about, const option_table<C>& table, C defaults,
                      void (*run)(C)) {
  static C settings;
  settings = std::move(defaults);
  auto* cmd = app.add_subcommand(name, about);
  add_options(*cmd, table, settings);
  cmd->callback([run] { run(settings); });
}

}  // namespace

void register_node_commands(CLI::App& app) {
  add_node_command(app, "server", "run the top tier: rounds, aggregation, server segments, evaluation",
                   server_options(), default_server_config(), run_server);
  add_node_command(app, "edge", "run an edge relay: devices below, the server above", edge_options(),
                   default_edge_config(), run_edge);
  add_node_command(app, "agent", "run a device agent: its data shard and its segments of the model", agent_options(),
                   default_agent_config(), run_agent);
  register_demo_command(app);
}

}  // namespace cleave::apps
