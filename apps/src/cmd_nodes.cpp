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

}  // namespace

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

// --idle-timeout SECONDS -> the node's link settings (names the option in errors).
void set_idle_timeout(runtime::link_settings& l, double seconds) {
  if (!(seconds >= 0.5 && seconds <= 3600)) throw core::error("--idle-timeout: expected 0.5 to 3600 seconds");
  l.idle_timeout = std::chrono::milliseconds(static_cast<long>(seconds * 1000));
}

constexpr const char* give_up_help =
    "stop with an error once the upstream has been unreachable this many seconds in a row (default 0: "
    "keep trying, as a service waits for its server to come back)";

struct server_options {
  server::server_config c;
  double idle_timeout = 10;
  std::string memory_budget;
  bool no_adapt = false;
  std::string listen = "127.0.0.1:7000";
  std::string mode = "splitfed", optimizer = "sgd", lr_schedule = "constant", aggregate = "mean";
  std::string codecs = "f32";
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

void run_server(server_options& o) {
  auto [host, port] = host_port(o.listen, "--listen");
  o.c.listen_host = host;
  o.c.port = port;
  o.c.mode = server::parse_mode(o.mode);
  o.c.opt.kind = core::parse_optimizer_kind(o.optimizer);
  o.c.lr_schedule = core::parse_schedule_kind(o.lr_schedule);
  o.c.aggregate = parse_aggregate_option(o.aggregate);
  try {
    o.c.codecs = core::parse_codec_set(o.codecs);
  } catch (const core::error& e) {
    throw core::error(std::string("--codecs: ") + e.what());
  }
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
  s->add_option("--codecs", so.codecs,
                "codecs the cut may use (f32, f16, bf16, int8[:stochastic], topk[:FRACTION] for gradients); a "
                "fixed plan takes the most compact per direction")
      ->capture_default_str();
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
  s->add_option("--stop-at-accuracy", so.c.stop_at_accuracy,
                "end training after the first round whose test accuracy reaches this (0: run every round)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  s->add_flag("--no-adapt", so.no_adapt, "keep the initial cuts (no adaptive re-splitting)");
  s->add_option("--min-device-blocks", so.c.min_device_blocks,
                "blocks every device keeps at the bottom at least (initial cuts and every re-split)")
      ->capture_default_str();
  s->add_option("--label-groups", so.c.label_groups,
                "train each class as G sub-classes drawn at random per sample and step (hides the label in the "
                "direction of the gradients a U-shaped device sends up; scored on the class logits)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  s->add_flag("--secure-aggregation", so.c.secure_aggregation,
              "devices upload only masked replicas: the server and edges learn sums, never one device's blocks");
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
  e->add_flag("--secure-aggregation", eo.c.secure_aggregation,
              "relay only masked device replicas; refuse a server that does not aggregate securely");
  e->add_option("--schedule", eo.c.schedule, "emulated link changes by round (text or file)");
  e->add_option("--metrics", eo.c.metrics, metrics_help);
  e->add_option("--idle-timeout", eo.idle_timeout, "seconds without a frame after which a link counts as lost")
      ->capture_default_str();
  e->add_option("--give-up-after", eo.c.links.give_up_s, give_up_help)->check(CLI::Range(0.0, 1e9));
  e->add_option("--profile-every", eo.c.profile_every,
                "device steps between profiles sent upstream (and at once when a link's bandwidth moved by 1.5x)")
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
  a->add_option("--give-up-after", ao.c.links.give_up_s, give_up_help)->check(CLI::Range(0.0, 1e9));
  a->add_option("--profile-every", ao.c.profile_every,
                "steps between profiles sent upstream (and at once when the link's bandwidth moved by 1.5x)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  a->add_flag("--equalise-cut-gradients", ao.c.equalise_cut_gradients,
              "U-shaped plans: every gradient sent up at the top cut rescaled to the micro-batch's RMS norm (the "
              "server cannot tell labels by norm); meant with the server's --label-groups");
  a->add_option("--cut-gradient-noise", ao.c.cut_gradient_noise,
                "U-shaped plans: noise on the gradients sent up at the top cut, S >= 0 (1: every sample's "
                "expected norm the batch's largest; more hides directions too)")
      ->check(CLI::Range(0.0, 1000.0));
  a->add_option("--activation-clip", ao.c.activation_clip,
                "clip each sample's activation at the bottom cut to this L2 norm (0: off)")
      ->check(CLI::Range(0.0, 1e9));
  a->add_option("--activation-noise", ao.c.activation_noise,
                "Gaussian noise on the clipped activations, std SIGMA x the clip; epsilon logged every round")
      ->check(CLI::Range(0.0, 1e6));
  a->add_option("--dp-delta", ao.c.dp_delta, "delta of the epsilon the activation noise reports")
      ->capture_default_str()
      ->check(CLI::Range(1e-300, 0.5));
  a->add_option("--nopeek", ao.c.nopeek,
                "weight of the distance correlation of inputs and cut activations in the device's loss (0: off)")
      ->check(CLI::Range(0.0, 1e6));
  a->add_option("--gradient-check", ao.c.gradient_check,
                "off, warn or refuse: gradients from upstream that do not follow the labels (a server steering "
                "this device's features)")
      ->capture_default_str()
      ->check(CLI::IsMember({"off", "warn", "refuse"}));
  a->add_option("--gradient-check-window", ao.c.gradient_check_window, "micro-batches the gradient check averages")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  a->add_option("--gradient-check-threshold", ao.c.gradient_check_threshold,
                "label alignment below which the gradient check alarms")
      ->capture_default_str();
  a->add_flag("--secure-aggregation", ao.c.secure_aggregation,
              "upload replicas only masked; refuse a server that does not aggregate securely");
  add_augment_option(a, ao.c.augment);
  a->callback([] { run_agent(ao); });
}

}  // namespace

void register_node_commands(CLI::App& app) {
  add_server_command(app);
  add_edge_command(app);
  add_agent_command(app);
  register_demo_command(app);
}

}  // namespace cleave::apps
