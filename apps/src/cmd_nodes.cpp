// `cleave server`, `cleave edge`, `cleave agent` and `cleave demo`: the split-learning nodes and
// a local federation of them on loopback.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

namespace cleave::apps {

namespace {

namespace fs = std::filesystem;

// "host:port" -> parts; names the option in errors.
std::pair<std::string, std::uint16_t> host_port(const std::string& s, const char* option) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    throw core::error(std::string(option) + " '" + s + "': expected HOST:PORT");
  int port = 0;
  try {
    port = std::stoi(s.substr(colon + 1));
  } catch (...) {
    port = -1;
  }
  if (port < 0 || port > 65535) throw core::error(std::string(option) + " '" + s + "': bad port");
  return {s.substr(0, colon), static_cast<std::uint16_t>(port)};
}

// "512M", "2G", "1048576" -> bytes; names the option in errors.
std::uint64_t parse_bytes(const std::string& s, const char* option) {
  std::size_t used = 0;
  double v = -1;
  try {
    v = std::stod(s, &used);
  } catch (...) {
    v = -1;
  }
  const std::string unit = s.substr(used);
  double k = 0;
  if (unit.empty() || unit == "B")
    k = 1;
  else if (unit == "K" || unit == "KiB")
    k = 1024.0;
  else if (unit == "M" || unit == "MiB")
    k = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    k = 1024.0 * 1024 * 1024;
  if (!(v >= 0) || k == 0) throw core::error(std::string(option) + " '" + s + "': expected a size such as 512M or 2G");
  return static_cast<std::uint64_t>(v * k);
}

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

// --idle-timeout SECONDS -> the node's link settings (names the option in errors).
void set_idle_timeout(runtime::link_settings& l, double seconds) {
  if (!(seconds >= 0.5 && seconds <= 3600)) throw core::error("--idle-timeout: expected 0.5 to 3600 seconds");
  l.idle_timeout = std::chrono::milliseconds(static_cast<long>(seconds * 1000));
}

struct server_options {
  server::server_config c;
  double idle_timeout = 10;
  std::string memory_budget;
  bool no_adapt = false;
  std::string listen = "127.0.0.1:7000";
  std::string mode = "splitfed", optimizer = "sgd", lr_schedule = "constant", aggregate = "mean";
};

struct edge_options {
  edge::edge_config c;
  double idle_timeout = 10;
  std::string memory_budget;
  std::string listen = "127.0.0.1:7100", upstream = "127.0.0.1:7000";
};

struct agent_options {
  device::agent_config c;
  double idle_timeout = 10;
  std::string memory_budget;
  std::string connect = "127.0.0.1:7000", shard = "0/1";
  std::string upstream_role;
};

struct demo_options {
  std::string work;
  int devices = 4, rounds = 8, local_steps = 150;
  std::string partition = "dirichlet:0.5", backend = "auto", mode = "splitfed", model = "lenet5";
  std::string lr_schedule = "constant", aggregate = "mean";
  std::string data = "fashion-mnist";
  bool u_shape = false, keep = false, no_adapt = false;
  std::string schedule, device_backends;
  std::string dashboard, metrics;  // the server's
  int slow = 0;
  double slowdown = 1.0;
  float lr = 0.05f;
  std::uint64_t seed = 1;
  core::augment_config augment;
};

void run_server(server_options& o) {
  auto [host, port] = host_port(o.listen, "--listen");
  o.c.listen_host = host;
  o.c.port = port;
  o.c.mode = server::parse_mode(o.mode);
  o.c.opt.kind = core::parse_optimizer_kind(o.optimizer);
  o.c.lr_schedule = core::parse_schedule_kind(o.lr_schedule);
  o.c.aggregate = parse_aggregate_option(o.aggregate);
  if (!o.memory_budget.empty()) o.c.memory_budget = parse_bytes(o.memory_budget, "--memory-budget");
  o.c.adaptive = !o.no_adapt;
  set_idle_timeout(o.c.links, o.idle_timeout);
  server::server_node node(o.c);
  node.stop_on_signals();
  node.run();
  if (!node.checkpoint_failure().empty())
    throw core::error("training finished, but a checkpoint write failed (" + node.checkpoint_failure() + "); '" +
                      o.c.checkpoint.string() + "' holds the last one written");
}

void run_edge(edge_options& o) {
  auto [host, port] = host_port(o.listen, "--listen");
  auto [uh, up] = host_port(o.upstream, "--server");
  o.c.listen_host = host;
  o.c.port = port;
  o.c.upstream_host = uh;
  o.c.upstream_port = up;
  if (!o.memory_budget.empty()) o.c.memory_budget = parse_bytes(o.memory_budget, "--memory-budget");
  set_idle_timeout(o.c.links, o.idle_timeout);
  edge::edge_node node(o.c);
  node.stop_on_signals();
  node.run();
}

void run_agent(agent_options& o) {
  auto [host, port] = host_port(o.connect, "--connect");
  o.c.upstream_host = host;
  o.c.upstream_port = port;
  const auto slash = o.shard.find('/');
  try {
    if (slash == std::string::npos) throw 0;
    o.c.shard = std::stoi(o.shard.substr(0, slash));
    o.c.n_shards = std::stoi(o.shard.substr(slash + 1));
  } catch (...) {
    throw core::error("--shard '" + o.shard + "': expected K/N, e.g. 2/4");
  }
  if (o.c.name.empty()) o.c.name = "device-" + std::to_string(o.c.id);
  if (!o.upstream_role.empty()) o.c.upstream_role = core::tier_from_name(o.upstream_role);
  if (!o.memory_budget.empty()) o.c.memory_budget = parse_bytes(o.memory_budget, "--memory-budget");
  set_idle_timeout(o.c.links, o.idle_timeout);
  device::agent node(o.c);
  node.stop_on_signals();
  node.run();
}

pid_t spawn(const std::vector<std::string>& args, const fs::path& log) {
  const pid_t pid = ::fork();
  if (pid < 0) throw core::error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    if (!log.empty()) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
        ::close(fd);
      }
    }
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    std::fprintf(stderr, "exec failed: %s\n", std::strerror(errno));
    ::_exit(127);
  }
  return pid;
}

// The demo's CA and the certificates of its server, edge-1 and device-1..n (kept when present).
void provision_demo(const fs::path& certs, int n_devices) {
  federation::provision_local(certs, n_devices, 1);
  spdlog::info("demo: certificates for the CA, server, edge-1 and device-1..{} in {}", n_devices, certs.string());
}

// Waits for the server, then gives the other nodes a moment to end (the server tells them
// training is over) before stopping them; returns the server's wait status.
int wait_for_demo(pid_t server, const std::vector<pid_t>& others) {
  static std::vector<pid_t>* children = nullptr;
  static std::vector<pid_t> all;
  all = others;
  all.push_back(server);
  children = &all;
  auto forward = [](int sig) {
    for (pid_t p : *children) ::kill(p, sig);
  };
  std::signal(SIGINT, forward);
  std::signal(SIGTERM, forward);
  int status = 0;
  while (::waitpid(server, &status, 0) < 0 && errno == EINTR) {
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (pid_t p : others) {
    int st = 0;
    while (::waitpid(p, &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > until) {
        ::kill(p, SIGKILL);
        ::waitpid(p, &st, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return status;
}

// The command line of the demo's server.
std::vector<std::string> demo_server_args(const demo_options& o, const fs::path& certs, const std::string& listen,
                                          const fs::path& work, const std::string& level) {
  std::vector<std::string> sargs{"cleave",        "--log-level",
                                 level,           "server",
                                 "--certs",       certs.string(),
                                 "--listen",      listen,
                                 "--model",       o.model,
                                 "--data",        o.data,
                                 "--backend",     o.backend,
                                 "--mode",        o.mode,
                                 "--rounds",      std::to_string(o.rounds),
                                 "--local-steps", std::to_string(o.local_steps),
                                 "--min-devices", std::to_string(o.devices),
                                 "--lr",          std::to_string(o.lr),
                                 "--lr-schedule", o.lr_schedule,
                                 "--aggregate",   o.aggregate,
                                 "--seed",        std::to_string(o.seed),
                                 "--checkpoint",  (work / "global.ckpt").string(),
                                 "--fresh",       "--force"};  // every demo is a run of its own
  if (o.u_shape) sargs.push_back("--u-shape");
  if (o.no_adapt) sargs.push_back("--no-adapt");
  if (!o.dashboard.empty()) sargs.insert(sargs.end(), {"--dashboard", o.dashboard});
  if (!o.metrics.empty()) sargs.insert(sargs.end(), {"--metrics", o.metrics});
  if (!o.schedule.empty()) {
    sargs.push_back("--schedule");
    sargs.push_back(o.schedule);
  }
  return sargs;
}

void run_demo(const demo_options& o) {
  const auto device_specs = parse_backend_list(o.device_backends, "--device-backends");
  core::parse_schedule_kind(o.lr_schedule);  // named now, not in the server's log
  parse_aggregate_option(o.aggregate);
  const fs::path work =
      o.work.empty() ? fs::temp_directory_path() / ("cleave-demo-" + std::to_string(::getpid())) : fs::path(o.work);
  fs::create_directories(work);
  const fs::path certs = work / "certs";
  spdlog::info("demo: 1 server, 1 edge, {} devices on loopback; work directory {}", o.devices, work.string());
  provision_demo(certs, o.devices);

  // All nodes share this machine's cores: give each oneDNN node its share of threads (OpenMP
  // teams of competing processes stall each other) and let idle OpenMP threads sleep.
  auto node_backend = [&](const std::string& b) {
    if (b == "onednn" || (b == "auto" && backend::resolve_auto() == "onednn")) {
      const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      return "onednn:" + std::to_string(std::max(1u, cores / static_cast<unsigned>(o.devices + 2)));
    }
    return b;
  };
  const std::string backend = node_backend(o.backend);
  // Device i runs the ((i - 1) mod n)-th entry of --device-backends (default: --backend).
  std::vector<std::string> device_backends;
  for (const auto& b : device_specs) device_backends.push_back(node_backend(b));
  if (device_backends.empty()) device_backends.push_back(backend);
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  const auto server_port = transport::free_loopback_port(), edge_port = transport::free_loopback_port();
  const std::string sp = "127.0.0.1:" + std::to_string(server_port);
  const std::string ep = "127.0.0.1:" + std::to_string(edge_port);
  const std::string level = spdlog::level::to_string_view(spdlog::get_level()).data();
  const auto sargs = demo_server_args(o, certs, sp, work, level);
  // The server's log (one line per round) goes to this terminal; the others to files.
  const pid_t server = spawn(sargs, {});
  std::vector<pid_t> others;
  std::vector<std::string> eargs{"cleave", "--log-level", level, "edge",     "--certs", certs.string(), "--name",
                                 "edge-1", "--listen",    ep,    "--server", sp,        "--backend",    backend};
  if (!o.schedule.empty()) eargs.insert(eargs.end(), {"--schedule", o.schedule});
  others.push_back(spawn(eargs, work / "edge-1.log"));
  for (int i = 1; i <= o.devices; ++i) {
    std::vector<std::string> extra;
    if (!o.schedule.empty()) extra = {"--schedule", o.schedule};
    if (i <= o.slow) extra.insert(extra.end(), {"--slowdown", std::to_string(o.slowdown)});
    if (o.augment.any()) extra.insert(extra.end(), {"--augment", core::augment_str(o.augment)});
    std::vector<std::string> aargs{"cleave",
                                   "--log-level",
                                   level,
                                   "agent",
                                   "--certs",
                                   certs.string(),
                                   "--id",
                                   std::to_string(i),
                                   "--connect",
                                   ep,
                                   "--upstream-name",
                                   "edge-1",
                                   "--data",
                                   o.data,
                                   "--shard",
                                   std::to_string(i - 1) + "/" + std::to_string(o.devices),
                                   "--partition",
                                   o.partition,
                                   "--backend",
                                   device_backends[static_cast<std::size_t>(i - 1) % device_backends.size()]};
    aargs.insert(aargs.end(), extra.begin(), extra.end());
    others.push_back(spawn(aargs, work / ("device-" + std::to_string(i) + ".log")));
  }
  spdlog::info("demo: started server (pid {}), edge-1 and {} device agents; their logs: {}/*.log", server, o.devices,
               work.string());
  const int status = wait_for_demo(server, others);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw core::error("the server failed (see above; the other nodes' logs are in " + work.string() + ")");
  spdlog::info("demo: done; global model in {}, logs in {}", (work / "global.ckpt").string(), work.string());
}

}  // namespace

namespace {

constexpr const char* metrics_help =
    "serve Prometheus metrics on http://ADDR/metrics: PORT (loopback) or HOST:PORT (0.0.0.0:PORT for every "
    "interface); default: none";

void add_server_command(CLI::App& app) {
  static server_options so;
  auto* s = app.add_subcommand("server", "run the top tier: rounds, aggregation, server segments, evaluation");
  s->add_option("--certs", so.c.certs, "certificate directory (cleave certs)")->required();
  s->add_option("--name", so.c.name, "this node's certificate name")->capture_default_str();
  s->add_option("--listen", so.listen, "HOST:PORT to accept edges and devices on")->capture_default_str();
  s->add_option("--allow", so.c.allowed, "certificate names allowed to connect (repeatable; default: any)");
  s->add_option("--backend", so.c.backend, "compute backend")->capture_default_str();
  s->add_option("--model", so.c.model, "zoo model or .json spec")->capture_default_str();
  s->add_option("--data", so.c.data, "data set whose test split evaluates the global model")->capture_default_str();
  s->add_option("--mode", so.mode, "splitfed (per-device server replicas) or sequential (one shared)")
      ->capture_default_str();
  s->add_flag("--u-shape", so.c.u_shape, "U-shaped plans: the top blocks and the loss stay on the devices");
  s->add_option("--cuts", so.c.cuts, "cuts for devices connected directly, e.g. 6 (U-shape: 6,11)");
  s->add_option("--edge-cuts", so.c.edge_cuts, "cuts for devices behind an edge, e.g. 3,6");
  s->add_option("--rounds", so.c.rounds, "rounds")->capture_default_str()->check(CLI::Range(1, 1000000));
  s->add_option("--local-steps", so.c.local_steps, "steps per device per round")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  s->add_option("--batch", so.c.batch, "batch size")->capture_default_str()->check(CLI::Range(1, 65536));
  s->add_option("--micro-batches", so.c.micro_batches, "micro-batches per step (pipelined)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  s->add_option("--min-devices", so.c.min_devices, "devices connected before every round starts")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  s->add_option("--deadline", so.c.round_deadline_s, "round deadline in seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  s->add_flag("--exit-on-join-timeout", so.c.exit_on_join_timeout,
              "end with an error when --min-devices are not connected within --join-timeout (default: keep waiting)");
  s->add_option("--idle-timeout", so.idle_timeout, "seconds without a frame after which a link counts as lost")
      ->capture_default_str();
  s->add_option("--join-timeout", so.c.join_timeout_s, "seconds to wait for --min-devices before logging it")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  s->add_option("--seed", so.c.seed, "seed of the initial weights")->capture_default_str();
  s->add_option("--optimizer", so.optimizer, "sgd or adamw")->capture_default_str();
  s->add_option("--lr", so.c.opt.lr, "learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  s->add_option("--lr-schedule", so.lr_schedule,
                "learning rate by round: constant, step (x0.1 after every third of the rounds) or cosine")
      ->capture_default_str();
  s->add_option("--warmup-rounds", so.c.warmup_rounds, "rounds of linear learning-rate warm-up")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  s->add_option("--momentum", so.c.opt.momentum, "SGD momentum")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  s->add_option("--weight-decay", so.c.opt.weight_decay, "weight decay")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  s->add_option("--aggregate", so.aggregate,
                "how replicas combine each round: mean (weighted by samples), median, trimmed-mean:F (F of the "
                "largest and smallest values per coordinate dropped, 0 <= F < 0.5) or clip:C (each update's norm "
                "bounded by C, then the mean); all but mean have edges forward each device's replicas")
      ->capture_default_str();
  s->add_option("--checkpoint", so.c.checkpoint,
                "save the global model here after every round (`cleave eval --checkpoint` reads it)");
  s->add_flag("--fresh", so.c.fresh,
              "start over instead of resuming from the newest --checkpoint (with one there, only with --force)");
  s->add_flag("--force", so.c.force, "with --fresh: overwrite the checkpoints of an earlier run");
  s->add_option("--keep-checkpoints", so.c.keep_checkpoints, "earlier rounds' checkpoints kept beside it (PATH.1, ...)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  s->add_option("--eval-every", so.c.eval_every, "evaluate the global model every N rounds (the last round always)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  s->add_option("--eval-samples", so.c.eval_samples,
                "evaluate on this many test samples, a fixed seeded subset (0: all; the last round: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  s->add_flag("--no-adapt", so.no_adapt, "keep the initial cuts (no adaptive re-splitting)");
  s->add_option("--min-gain", so.c.min_gain, "re-split only for at least this relative step-time gain")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  s->add_option("--repay-rounds", so.c.repay_rounds, "a re-split must repay its migration within these rounds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  s->add_option("--memory-budget", so.memory_budget,
                "memory the server's blocks may use, e.g. 8G (default: half the RAM)");
  s->add_option("--schedule", so.c.schedule,
                "emulated link changes by round (text or file), e.g. 'at 3 link server * 10Mbit/s 20ms'");
  s->add_option("--metrics", so.c.metrics, metrics_help);
  s->add_option("--run-log", so.c.run_log, "append one JSON object per round to this file (for plots and scripts)");
  s->add_option("--dashboard", so.c.dashboard,
                "serve the live dashboard on http://ADDR/: PORT (loopback) or HOST:PORT (beyond loopback only with "
                "--dashboard-token)");
  s->add_option("--dashboard-token", so.c.dashboard_token,
                "token every dashboard request must carry (?token=TOKEN or Authorization: Bearer TOKEN)")
      ->envname("CLEAVE_DASHBOARD_TOKEN");
  s->callback([] { run_server(so); });
}

void add_edge_command(CLI::App& app) {
  static edge_options eo;
  auto* e = app.add_subcommand("edge", "run an edge relay: devices below, the server above");
  e->add_option("--certs", eo.c.certs, "certificate directory (cleave certs)")->required();
  e->add_option("--name", eo.c.name, "this node's certificate name")->capture_default_str();
  e->add_option("--id", eo.c.id, "node id (distinct from device ids)")
      ->capture_default_str()
      ->check(CLI::Range(1, 999999));
  e->add_option("--listen", eo.listen, "HOST:PORT to accept devices on")->capture_default_str();
  e->add_option("--allow", eo.c.allowed, "device certificate names allowed to connect (repeatable)");
  e->add_option("--server", eo.upstream, "HOST:PORT of the server")->capture_default_str();
  e->add_option("--server-name", eo.c.upstream_name, "the server's certificate name")->capture_default_str();
  e->add_option("--backend", eo.c.backend, "compute backend")->capture_default_str();
  e->add_option("--memory-budget", eo.memory_budget, "memory its blocks may use, e.g. 2G (default: half the RAM)");
  e->add_option("--schedule", eo.c.schedule, "emulated link changes by round (text or file)");
  e->add_option("--metrics", eo.c.metrics, metrics_help);
  e->add_option("--idle-timeout", eo.idle_timeout, "seconds without a frame after which a link counts as lost")
      ->capture_default_str();
  e->add_option("--profile-every", eo.c.profile_every, "device steps between profiles sent upstream")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  e->callback([] { run_edge(eo); });
}

void add_agent_command(CLI::App& app) {
  static agent_options ao;
  auto* a = app.add_subcommand("agent", "run a device agent: its data shard and its segments of the model");
  a->add_option("--certs", ao.c.certs, "certificate directory (cleave certs)")->required();
  a->add_option("--name", ao.c.name, "this device's certificate name (default device-ID)");
  a->add_option("--id", ao.c.id, "device id (> 0, unique)")->required()->check(CLI::Range(1, 999999));
  a->add_option("--connect", ao.connect, "HOST:PORT of its edge or the server")->capture_default_str();
  a->add_option("--upstream-name", ao.c.upstream_name, "required certificate name of the upstream node");
  a->add_option("--upstream-role", ao.upstream_role,
                "role the upstream's certificate must hold: server or edge (default: server, or either when "
                "--upstream-name pins the node)")
      ->check(CLI::IsMember({"server", "edge"}));
  a->add_option("--backend", ao.c.backend, "compute backend")->capture_default_str();
  a->add_option("--data", ao.c.data, "'fashion-mnist', or a directory of IDX or CIFAR binary files")
      ->capture_default_str();
  a->add_option("--shard", ao.shard, "K/N: this device holds shard K of N")->capture_default_str();
  a->add_option("--partition", ao.c.partition, "iid, dirichlet:ALPHA, classes:K or all")->capture_default_str();
  a->add_option("--partition-seed", ao.c.partition_seed, "seed of the partition (same on every device)")
      ->capture_default_str();
  a->add_option("--slowdown", ao.c.slowdown, "make compute this many times slower (emulated weak board)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1000.0));
  a->add_option("--memory-budget", ao.memory_budget, "memory its blocks may use, e.g. 512M (default: half the RAM)");
  a->add_option("--schedule", ao.c.schedule,
                "emulated changes by round (text or file), e.g. 'at 3 link device-2 edge-1 10Mbit/s 40ms; at 2 "
                "slowdown device-2 4'");
  a->add_option("--metrics", ao.c.metrics, metrics_help);
  a->add_option("--idle-timeout", ao.idle_timeout, "seconds without a frame after which a link counts as lost")
      ->capture_default_str();
  a->add_option("--profile-every", ao.c.profile_every, "steps between profiles sent upstream")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  add_augment_option(a, ao.c.augment);
  a->callback([] { run_agent(ao); });
}

void add_demo_command(CLI::App& app) {
  static demo_options dm;
  auto* d = app.add_subcommand("demo", "a federation on loopback: 1 server, 1 edge, N devices as processes");
  d->add_option("--work", dm.work, "work directory (default: a new one under /tmp)");
  d->add_option("--devices", dm.devices, "devices")->capture_default_str()->check(CLI::Range(1, 64));
  d->add_option("--rounds", dm.rounds, "rounds")->capture_default_str()->check(CLI::Range(1, 1000));
  d->add_option("--local-steps", dm.local_steps, "steps per device per round")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  d->add_option("--partition", dm.partition, "how the training set is split across devices")->capture_default_str();
  d->add_option("--backend", dm.backend, "backend of every node")->capture_default_str();
  d->add_option("--device-backends", dm.device_backends,
                "backends of the devices, comma-separated, repeated over devices 1..N (default: --backend)");
  d->add_option("--mode", dm.mode, "splitfed or sequential")->capture_default_str();
  d->add_option("--model", dm.model, "zoo model or .json spec")->capture_default_str();
  d->add_option("--data", dm.data, "data set")->capture_default_str();
  d->add_option("--lr", dm.lr, "learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  d->add_option("--lr-schedule", dm.lr_schedule, "learning rate by round: constant, step or cosine")
      ->capture_default_str();
  d->add_option("--aggregate", dm.aggregate, "mean, median, trimmed-mean:F or clip:C (see cleave server --help)")
      ->capture_default_str();
  d->add_option("--seed", dm.seed, "seed")->capture_default_str();
  d->add_flag("--u-shape", dm.u_shape, "labels stay on the devices");
  d->add_flag("--no-adapt", dm.no_adapt, "keep the initial cuts");
  d->add_option("--schedule", dm.schedule, "emulated heterogeneity by round, given to every node (text or file)");
  d->add_option("--slow", dm.slow, "devices 1..N run --slowdown times slower")->check(CLI::Range(0, 64));
  d->add_option("--slowdown", dm.slowdown, "slowdown of the --slow devices")->check(CLI::Range(1.0, 1000.0));
  d->add_option("--dashboard", dm.dashboard, "the server's live dashboard on http://ADDR/ (PORT: loopback)");
  d->add_option("--metrics", dm.metrics, "the server's Prometheus metrics on http://ADDR/metrics (PORT: loopback)");
  add_augment_option(d, dm.augment);  // given to the device agents
  d->callback([] { run_demo(dm); });
}

}  // namespace

void register_node_commands(CLI::App& app) {
  add_server_command(app);
  add_edge_command(app);
  add_agent_command(app);
  add_demo_command(app);
}

}  // namespace cleave::apps
