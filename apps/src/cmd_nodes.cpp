// `cleave server`, `cleave edge`, `cleave agent` and `cleave demo`: the split-learning nodes and
// a local federation of them on loopback.
#include <fcntl.h>
#include <malloc.h>
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
#include <functional>
#include <mutex>
#include <thread>

#include "cleave/backend/registry.h"
#include "cleave/core/atomic_file.h"
#include "cleave/device/agent.h"
#include "cleave/edge/edge_node.h"
#include "cleave/federation/local_federation.h"
#include "cleave/server/job_service.h"
#include "cleave/server/server_node.h"
#include "cleave/transport/certs.h"
#include "cleave/transport/listener.h"
#include "commands.h"
#include "job_file.h"
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

// Stop signals for the whole process. A stop signal that arrives while a node is already ending
// (its signal set gone, the process not yet exited) must not kill it with status 143, as it would
// once Asio gives SIGINT and SIGTERM back to their default action; and a node that serves job
// after job (--stay, --state) must end for good, whichever node is running when it comes. A second
// signal set, on a thread of its own for the process's life, records the signal and stops the
// node now running.
struct stop_watch {
  std::mutex mu;
  bool seen = false;
  std::function<void()> stop_current;
};

stop_watch& watch() {
  static stop_watch w;
  return w;
}

void keep_stop_signals_handled() {
  static const bool started = [] {
    auto* io = new asio::io_context;
    auto* held = new asio::signal_set(*io, SIGINT, SIGTERM);
    held->async_wait([](const std::error_code& ec, int) {
      if (ec) return;
      std::lock_guard lock(watch().mu);
      watch().seen = true;
      if (watch().stop_current) watch().stop_current();
    });
    std::thread([io] { io->run(); }).detach();
    return true;
  }();
  static_cast<void>(started);
}

// Makes `stop` what a stop signal calls (nothing: none); false when one already came.
bool on_stop_signal(std::function<void()> stop) {
  std::lock_guard lock(watch().mu);
  watch().stop_current = std::move(stop);
  return !watch().seen;
}

// Runs a node built from c, and with c.stay a new one each time the run ends (the next job of a
// long-running server), until a stop signal; nothing of one run is kept into the next.
template <class Node, class C>
void serve_runs(C c, const std::string& who) {
  keep_stop_signals_handled();
  for (int run = 1;; ++run) {
    {
      Node node(c);
      node.stop_on_signals();
      if (!on_stop_signal([&node] { node.stop(); })) break;
      node.run();
      if (!on_stop_signal(nullptr) || !c.stay) break;
      if constexpr (std::is_same_v<Node, device::agent>) {
        // A job on another data set this device offers: the next run holds that one, and the
        // one it held stays offered.
        if (const std::string want = node.data_set_wanted(); !want.empty()) {
          const std::string held = c.data_name.empty() ? c.data : c.data_name;
          if (std::none_of(c.offers.begin(), c.offers.end(),
                           [&](const std::string& o) { return o.rfind(held + "=", 0) == 0; }))
            c.offers.push_back(held + "=" + c.data);
          c.data_name = want.substr(0, want.find('='));
          c.data = want.substr(want.find('=') + 1);
        }
      }
    }
    ::malloc_trim(0);  // what the run freed goes back to the system, not kept for the next job
    spdlog::info("{}: run {} ended; staying up for the next job", who, run);
  }
}

server::server_config job_file_settings(const server::server_config& c) {
  return job_settings(c, core::read_file(c.job_file), c.job_file.string());
}

void run_jobs(const server::server_config& c) {
  server::job_service_config jc;
  jc.node = c;
  jc.state_dir = c.state_dir;
  jc.settings_for = [base = c](const std::string& text, const std::string& file) {
    return job_settings(base, text, file);
  };
  server::job_service service(std::move(jc));
  keep_stop_signals_handled();
  if (!on_stop_signal([&service] { service.stop(); })) return;
  service.run();
  on_stop_signal(nullptr);
}

void run_server(server::server_config c) {
  if (!c.state_dir.empty() && !c.job_file.empty())
    throw core::error("--state runs the jobs submitted to it; --job runs one job file: give one of them");
  if (!c.state_dir.empty()) return run_jobs(c);
  if (!c.job_file.empty()) c = job_file_settings(c);
  server::server_node node(c);
  node.stop_on_signals();
  keep_stop_signals_handled();
  node.run();
  if (!node.checkpoint_failure().empty())
    throw core::error("training finished, but a checkpoint write failed (" + node.checkpoint_failure() + "); '" +
                      c.checkpoint.string() + "' holds the last one written");
}

void run_edge(edge::edge_config c) {
  serve_runs<edge::edge_node>(c, c.name);
}

void run_agent(device::agent_config c) {
  if (c.name.empty()) c.name = "device-" + std::to_string(c.id);
  serve_runs<device::agent>(c, c.name);
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
