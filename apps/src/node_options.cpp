// The options of the three node commands, written once: flags, configuration file keys, the
// demo's child command lines and the options reference all come from these tables.
#include "node_options.h"

#include <cctype>

#include "cleave/core/error.h"
#include "cleave/split/plan.h"
#include "commands.h"

namespace cleave::apps {

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

namespace {

using strings = std::vector<std::string>;

constexpr const char* metrics_help =
    "serve Prometheus metrics on http://ADDR/metrics: PORT (loopback) or HOST:PORT (0.0.0.0:PORT for every "
    "interface: with --metrics-token or --metrics-public); default: none";
constexpr const char* give_up_help =
    "stop with an error once the upstream has been unreachable this many seconds in a row (default 0: "
    "keep trying, as a service waits for its server to come back)";
constexpr const char* idle_help = "seconds without a frame after which a link counts as lost";

// The options every node has, on a configuration C with the fields all nodes share.
template <class C>
void add_common(option_table<C>& t, const char* name_help) {
  t.push_back(value<C>(
                  "certs", "DIR", "certificate directory (cleave certs)", [](C & c) -> auto& { return c.certs; })
                  .needed());
  t.push_back(value<C>(
      "name", "NAME", name_help, [](C & c) -> auto& { return c.name; }));
}

// A node that serves job after job of a long-running server.
template <class C>
option<C> stay_option() {
  return flag<C>(
      "stay", "stay up when a run ends and serve the next job of a long-running server (until SIGTERM)",
      [](C & c) -> auto& { return c.stay; });
}

template <class C>
option<C> backend_option() {
  return value<C>(
      "backend", "NAME",
      "compute backend: reference, onednn[:threads][,portable], vulkan[:dev], "
      "cuda[:dev] or auto",
      [](C & c) -> auto& { return c.backend; });
}

template <class C>
option<C> memory_budget_option(const char* help) {
  return parsed<C>(
      "memory-budget", "BYTES", help,
      [](C& c, const std::string& v) { c.memory_budget = parse_bytes(v, "--memory-budget"); },
      [](const C& c) { return c.memory_budget ? strings{std::to_string(c.memory_budget)} : strings{}; });
}

// Block cuts ("3" or "3,6"), parsed where they are read.
template <class C>
option<C> cuts_option(const char* name, const char* help, std::vector<int> C::*field) {
  return parsed<C>(
      name, "LIST", help, [field](C& c, const std::string& v) { c.*field = split::parse_cuts(v); },
      [field](const C& c) { return (c.*field).empty() ? strings{} : strings{split::cuts_text(c.*field)}; });
}

template <class C>
option<C> schedule_option(const char* help) {
  return parsed<C>(
      "schedule", "TEXT|FILE", help, [](C& c, const std::string& v) { c.schedule = transport::parse_schedule(v); },
      [](const C& c) { return c.schedule.empty() ? strings{} : strings{c.schedule.text}; });
}

// --metrics, its token, and the flag that serves it beyond loopback without one.
template <class C>
void push_metrics_options(option_table<C>& t) {
  t.push_back(value<C>(
      "metrics", "ADDR", metrics_help, [](C & c) -> auto& { return c.metrics; }));
  t.push_back(value<C>(
                  "metrics-token", "TOKEN",
                  "token every /metrics request must carry (Authorization: Bearer TOKEN, as Prometheus sends it "
                  "with its authorization settings, or ?token=TOKEN); at least 16 characters beyond loopback",
                  [](C & c) -> auto& { return c.metrics_token; })
                  .from_env("CLEAVE_METRICS_TOKEN"));
  t.push_back(flag<C>(
      "metrics-public",
      "serve --metrics beyond loopback without a token, to anyone who reaches the port (warned at start)",
      [](C & c) -> auto& { return c.metrics_public; }));
}

template <class C>
option<C> idle_timeout_option() {
  return parsed<C, double>(
      "idle-timeout", "SECONDS", idle_help,
      [](C& c, const double& s) {
        if (!(s >= 0.5 && s <= 3600)) throw core::error("--idle-timeout: expected 0.5 to 3600 seconds");
        c.links.idle_timeout = std::chrono::milliseconds(static_cast<long>(s * 1000));
      },
      [](const C& c) { return strings{fmt::format("{}", c.links.idle_timeout.count() / 1000.0)}; });
}

template <class C>
option<C> give_up_option() {
  return value<C>(
             "give-up-after", "SECONDS", give_up_help, [](C & c) -> auto& { return c.links.give_up_s; })
      .in(CLI::Range(0.0, 1e9));
}

template <class C>
option<C> profile_every_option(const char* help) {
  return value<C>(
             "profile-every", "N", help, [](C & c) -> auto& { return c.profile_every; })
      .in(CLI::Range(1, 1000000));
}

// An address a node listens on or connects to, into its host and port fields.
template <class C, class H, class P>
option<C> address_option(const char* name, const char* help, H host, P port) {
  const std::string flag = std::string("--") + name;
  return parsed<C>(
      name, "HOST:PORT", help,
      [host, port, flag](C& c, const std::string& v) { std::tie(host(c), port(c)) = host_port(v, flag.c_str()); },
      [host, port](const C& c) {
        auto& k = const_cast<C&>(c);
        return strings{host(k) + ":" + std::to_string(port(k))};
      });
}

option_table<server::server_config> make_server_options() {
  using C = server::server_config;
  option_table<C> t;
  add_common(t, "this node's certificate name");
  t.push_back(address_option<C>(
      "listen", "HOST:PORT to accept edges and devices on", [](C & c) -> auto& { return c.listen_host; },
      [](C & c) -> auto& { return c.port; }));
  t.push_back(value<C>(
      "allow", "NAME", "certificate names allowed to connect (repeatable; default: any)",
      [](C & c) -> auto& { return c.allowed; }));
  t.push_back(backend_option<C>());
  t.push_back(value<C>(
      "model", "NAME|FILE", "zoo model or .json spec", [](C & c) -> auto& { return c.model; }));
  t.push_back(value<C>(
      "data", "NAME|DIR", "data set whose test split evaluates the global model",
      [](C & c) -> auto& { return c.data; }));
  t.push_back(value<C>(
      "dataset", "NAME", "name of the data set the devices train on; a device holding another refuses (default: any)",
      [](C & c) -> auto& { return c.dataset; }));
  t.push_back(parsed<C>(
      "mode", "MODE", "splitfed (per-device server replicas) or sequential (one shared)",
      [](C& c, const std::string& v) {
        if (v != "splitfed" && v != "sequential")
          throw core::error("unknown mode '" + v + "' (known: splitfed, sequential)");
        c.mode = v == "splitfed" ? server::training_mode::splitfed : server::training_mode::sequential;
      },
      [](const C& c) { return strings{std::string(server::mode_name(c.mode))}; }));
  t.push_back(flag<C>(
      "u-shape", "U-shaped plans: the top blocks and the loss stay on the devices",
      [](C & c) -> auto& { return c.u_shape; }));
  t.push_back(cuts_option<C>("cuts", "cuts for devices connected directly, e.g. 6 (U-shape: 6,11)", &C::cuts));
  t.push_back(cuts_option<C>("edge-cuts", "cuts for devices behind an edge, e.g. 3,6", &C::edge_cuts));
  t.push_back(value<C>(
                  "rounds", "N", "rounds", [](C & c) -> auto& { return c.rounds; })
                  .in(CLI::Range(1, 1000000)));
  t.push_back(value<C>(
                  "local-steps", "N", "steps per device per round", [](C & c) -> auto& { return c.local_steps; })
                  .in(CLI::Range(1, 1000000)));
  t.push_back(value<C>(
                  "batch", "N", "batch size", [](C & c) -> auto& { return c.batch; })
                  .in(CLI::Range(1, 65536)));
  t.push_back(
      value<C>(
          "micro-batches", "N", "micro-batches per step (pipelined)", [](C & c) -> auto& { return c.micro_batches; })
          .in(CLI::Range(1, 1024)));
  t.push_back(parsed<C>(
      "codecs", "LIST",
      "codecs the cut may use (f32, f16, bf16, int8[:stochastic], topk[:FRACTION] for gradients); a fixed plan "
      "takes the most compact per direction",
      [](C& c, const std::string& v) {
        try {
          c.codecs = core::parse_codec_set(v);
        } catch (const core::error& e) {
          throw core::error(std::string("--codecs: ") + e.what());
        }
      },
      [](const C& c) { return strings{c.codecs.str()}; }));
  t.push_back(value<C>(
                  "min-devices", "N", "devices connected before every round starts",
                  [](C & c) -> auto& { return c.min_devices; })
                  .in(CLI::Range(1, 100000)));
  t.push_back(value<C>(
                  "deadline", "SECONDS", "round deadline in seconds", [](C & c) -> auto& { return c.round_deadline_s; })
                  .in(CLI::PositiveNumber));
  t.push_back(flag<C>(
      "exit-on-join-timeout",
      "end with an error when --min-devices are not connected within --join-timeout (default: keep "
      "waiting)",
      [](C & c) -> auto& { return c.exit_on_join_timeout; }));
  t.push_back(idle_timeout_option<C>());
  t.push_back(value<C>(
                  "join-timeout", "SECONDS", "seconds to wait for --min-devices before logging it",
                  [](C & c) -> auto& { return c.join_timeout_s; })
                  .in(CLI::PositiveNumber));
  t.push_back(value<C>(
      "seed", "N", "seed of the initial weights", [](C & c) -> auto& { return c.seed; }));
  t.push_back(parsed<C>(
      "optimizer", "NAME", "sgd or adamw",
      [](C& c, const std::string& v) { c.opt.kind = core::parse_optimizer_kind(v); },
      [](const C& c) { return strings{c.opt.kind == core::optimizer_kind::adamw ? "adamw" : "sgd"}; }));
  t.push_back(value<C>(
                  "lr", "X", "learning rate", [](C & c) -> auto& { return c.opt.lr; })
                  .in(CLI::PositiveNumber));
  t.push_back(parsed<C>(
      "lr-schedule", "NAME", "learning rate by round: constant, step (x0.1 after every third of the rounds) or cosine",
      [](C& c, const std::string& v) { c.lr_schedule = core::parse_schedule_kind(v); },
      [](const C& c) {
        return strings{c.lr_schedule == core::schedule_kind::step     ? "step"
                       : c.lr_schedule == core::schedule_kind::cosine ? "cosine"
                                                                      : "constant"};
      }));
  t.push_back(value<C>(
                  "warmup-rounds", "N", "rounds of linear learning-rate warm-up",
                  [](C & c) -> auto& { return c.warmup_rounds; })
                  .in(CLI::NonNegativeNumber));
  t.push_back(value<C>(
                  "momentum", "X", "SGD momentum", [](C & c) -> auto& { return c.opt.momentum; })
                  .in(CLI::Range(0.0, 1.0)));
  t.push_back(value<C>(
                  "weight-decay", "X", "weight decay", [](C & c) -> auto& { return c.opt.weight_decay; })
                  .in(CLI::NonNegativeNumber));
  t.push_back(parsed<C>(
      "aggregate", "RULE",
      "how replicas combine each round: mean (weighted by samples), median, trimmed-mean:F (F of the largest and "
      "smallest values per coordinate dropped, 0 <= F < 0.5) or clip:C (each update's norm bounded by C, then the "
      "mean); all but mean have edges forward each device's replicas",
      [](C& c, const std::string& v) { c.aggregate = parse_aggregate_option(v); },
      [](const C& c) { return strings{split::aggregate_name(c.aggregate)}; }));
  t.push_back(value<C>(
      "checkpoint", "PATH", "save the global model here after every round (`cleave eval --checkpoint` reads it)",
      [](C & c) -> auto& { return c.checkpoint; }));
  t.push_back(flag<C>(
      "fresh", "start over instead of resuming from the newest --checkpoint (with one there, only with --force)",
      [](C & c) -> auto& { return c.fresh; }));
  t.push_back(flag<C>(
      "force", "with --fresh: overwrite the checkpoints of an earlier run", [](C & c) -> auto& { return c.force; }));
  t.push_back(value<C>(
                  "keep-checkpoints", "N", "earlier rounds' checkpoints kept beside it (PATH.1, ...)",
                  [](C & c) -> auto& { return c.keep_checkpoints; })
                  .in(CLI::Range(0, 1000)));
  t.push_back(value<C>(
                  "eval-every", "N", "evaluate the global model every N rounds (the last round always)",
                  [](C & c) -> auto& { return c.eval_every; })
                  .in(CLI::Range(1, 1000000)));
  t.push_back(value<C>(
                  "eval-samples", "N",
                  "evaluate on this many test samples, a fixed seeded subset (0: all; the last round: all)",
                  [](C & c) -> auto& { return c.eval_samples; })
                  .in(CLI::NonNegativeNumber));
  t.push_back(value<C>(
                  "stop-at-accuracy", "X",
                  "end training after the first round whose test accuracy reaches this (0: run every round)",
                  [](C & c) -> auto& { return c.stop_at_accuracy; })
                  .in(CLI::Range(0.0, 1.0)));
  t.push_back(flag<C>(
      "no-adapt", "keep the initial cuts (no adaptive re-splitting)", [](C & c) -> auto& { return c.adaptive; },
      false));
  t.push_back(value<C>(
      "min-device-blocks", "N", "blocks every device keeps at the bottom at least (initial cuts and every re-split)",
      [](C & c) -> auto& { return c.min_device_blocks; }));
  t.push_back(value<C>(
                  "label-groups", "G",
                  "train each class as G sub-classes drawn at random per sample and step (hides the label in the "
                  "direction of the gradients a U-shaped device sends up; scored on the class logits)",
                  [](C & c) -> auto& { return c.label_groups; })
                  .in(CLI::Range(1, 1024)));
  t.push_back(flag<C>(
      "secure-aggregation",
      "devices upload only masked replicas: the server and edges learn sums, never one device's blocks",
      [](C & c) -> auto& { return c.secure_aggregation; }));
  t.push_back(value<C>(
                  "secagg-min-holders", "K",
                  "under secure aggregation, decode a block's sum only over at least K devices that held it; a block "
                  "fewer hold keeps its global value that round",
                  [](C & c) -> auto& { return c.secagg_min_holders; })
                  .in(CLI::Range(2, 1000000)));
  t.push_back(value<C>(
                  "min-gain", "X", "re-split only for at least this relative step-time gain",
                  [](C & c) -> auto& { return c.min_gain; })
                  .in(CLI::Range(0.0, 1.0)));
  t.push_back(value<C>(
                  "repay-rounds", "X", "a re-split must repay its migration within these rounds",
                  [](C & c) -> auto& { return c.repay_rounds; })
                  .in(CLI::PositiveNumber));
  t.push_back(memory_budget_option<C>("memory the server's blocks may use, e.g. 8G (default: half the RAM)"));
  t.push_back(
      schedule_option<C>("emulated link changes by round (text or file), e.g. 'at 3 link server * 10Mbit/s 20ms'"));
  push_metrics_options(t);
  t.push_back(value<C>(
      "run-log", "PATH", "append one JSON object per round to this file (for plots and scripts)",
      [](C & c) -> auto& { return c.run_log; }));
  t.push_back(value<C>(
      "state", "DIR",
      "run as a long-running server: jobs submitted with `cleave job` are queued in DIR and run one after another",
      [](C & c) -> auto& { return c.state_dir; }));
  t.push_back(value<C>(
      "job", "FILE", "take this run's settings from a job file (as `cleave job submit` takes them)",
      [](C & c) -> auto& { return c.job_file; }));
  t.push_back(value<C>(
      "dashboard", "ADDR",
      "serve the live dashboard on http://ADDR/: PORT (loopback) or HOST:PORT (beyond loopback only "
      "with --dashboard-token)",
      [](C & c) -> auto& { return c.dashboard; }));
  t.push_back(value<C>(
                  "dashboard-token", "TOKEN",
                  "token every dashboard request must carry (?token=TOKEN or Authorization: Bearer TOKEN)",
                  [](C & c) -> auto& { return c.dashboard_token; })
                  .from_env("CLEAVE_DASHBOARD_TOKEN"));
  return t;
}

option_table<edge::edge_config> make_edge_options() {
  using C = edge::edge_config;
  option_table<C> t;
  add_common(t, "this node's certificate name");
  t.push_back(value<C>(
                  "id", "N", "node id (distinct from device ids)", [](C & c) -> auto& { return c.id; })
                  .in(CLI::Range(1, 999999)));
  t.push_back(address_option<C>(
      "listen", "HOST:PORT to accept devices on", [](C & c) -> auto& { return c.listen_host; },
      [](C & c) -> auto& { return c.port; }));
  t.push_back(value<C>(
      "allow", "NAME", "device certificate names allowed to connect (repeatable)",
      [](C & c) -> auto& { return c.allowed; }));
  t.push_back(address_option<C>(
      "server", "HOST:PORT of the server", [](C & c) -> auto& { return c.upstream_host; },
      [](C & c) -> auto& { return c.upstream_port; }));
  t.push_back(value<C>(
      "server-name", "NAME", "the server's certificate name", [](C & c) -> auto& { return c.upstream_name; }));
  t.push_back(backend_option<C>());
  t.push_back(memory_budget_option<C>("memory its blocks may use, e.g. 2G (default: half the RAM)"));
  t.push_back(flag<C>(
      "secure-aggregation", "relay only masked device replicas; refuse a server that does not aggregate securely",
      [](C & c) -> auto& { return c.secure_aggregation; }));
  t.push_back(schedule_option<C>("emulated link changes by round (text or file)"));
  push_metrics_options(t);
  t.push_back(idle_timeout_option<C>());
  t.push_back(give_up_option<C>());
  t.push_back(profile_every_option<C>(
      "device steps between profiles sent upstream (and at once when a link's bandwidth moved by 1.5x)"));
  t.push_back(stay_option<C>());
  return t;
}

option_table<device::agent_config> make_agent_options() {
  using C = device::agent_config;
  option_table<C> t;
  add_common(t, "this device's certificate name (default device-ID)");
  t.push_back(value<C>(
                  "id", "N", "device id (> 0, unique)", [](C & c) -> auto& { return c.id; })
                  .needed()
                  .in(CLI::Range(1, 999999)));
  t.push_back(address_option<C>(
      "connect", "HOST:PORT of its edge or the server", [](C & c) -> auto& { return c.upstream_host; },
      [](C & c) -> auto& { return c.upstream_port; }));
  t.push_back(value<C>(
      "upstream-name", "NAME", "required certificate name of the upstream node",
      [](C & c) -> auto& { return c.upstream_name; }));
  t.push_back(parsed<C>(
                  "upstream-role", "ROLE",
                  "role the upstream's certificate must hold: server or edge (default: server, or either when "
                  "--upstream-name pins the node)",
                  [](C& c, const std::string& v) { c.upstream_role = core::tier_from_name(v); },
                  [](const C& c) {
                    return c.upstream_role ? strings{std::string(core::tier_name(*c.upstream_role))} : strings{};
                  })
                  .in(CLI::IsMember({"server", "edge"})));
  t.push_back(backend_option<C>());
  t.push_back(value<C>(
      "data", "NAME|DIR", "'fashion-mnist', or a directory of IDX or CIFAR binary files",
      [](C & c) -> auto& { return c.data; }));
  t.push_back(value<C>(
      "data-name", "NAME",
      "the name jobs know this device's data set by (default: --data); a plan naming another is refused",
      [](C & c) -> auto& { return c.data_name; }));
  t.push_back(value<C>(
      "offer", "NAME=DIR",
      "another data set this device trains on when a job names it (repeatable; with --stay it then reloads)",
      [](C & c) -> auto& { return c.offers; }));
  t.push_back(stay_option<C>());
  t.push_back(parsed<C>(
      "shard", "K/N", "K/N: this device holds shard K of N",
      [](C& c, const std::string& v) {
        const auto slash = v.find('/');
        try {
          if (slash == std::string::npos) throw 0;
          c.shard = std::stoi(v.substr(0, slash));
          c.n_shards = std::stoi(v.substr(slash + 1));
        } catch (...) {
          throw core::error("--shard '" + v + "': expected K/N, e.g. 2/4");
        }
      },
      [](const C& c) { return strings{std::to_string(c.shard) + "/" + std::to_string(c.n_shards)}; }));
  t.push_back(parsed<C>(
      "partition", "HOW", "iid, dirichlet:ALPHA, classes:K or all",
      [](C& c, const std::string& v) { c.partition = core::parse_partition(v); },
      [](const C& c) { return strings{core::partition_name(c.partition)}; }));
  t.push_back(value<C>(
      "partition-seed", "N", "seed of the partition (same on every device)",
      [](C & c) -> auto& { return c.partition_seed; }));
  // 0 (unset) is the default derived from the partition seed and the id: the docs show none.
  t.push_back(parsed<C>(
      "order-seed", "N",
      "seed of this device's data order (default: derived from --partition-seed and --id); local training with "
      "the same seed draws the same batches",
      [](C& c, const std::string& v) {
        std::size_t used = 0;
        try {
          c.order_seed = std::stoull(v, &used);
        } catch (...) {
          used = 0;
        }
        if (used != v.size() || used == 0 || !std::isdigit(static_cast<unsigned char>(v[0])) || c.order_seed == 0)
          throw core::error("--order-seed '" + v + "': expected a whole number > 0");
      },
      [](const C& c) { return c.order_seed ? strings{std::to_string(c.order_seed)} : strings{}; }));
  t.push_back(value<C>(
                  "slowdown", "X", "make compute this many times slower (emulated weak board)",
                  [](C & c) -> auto& { return c.slowdown; })
                  .in(CLI::Range(1.0, 1000.0)));
  t.push_back(memory_budget_option<C>("memory its blocks may use, e.g. 512M (default: half the RAM)"));
  t.push_back(value<C>(
      "allow-model", "SHA256",
      "train only the model specs of these SHA-256s (repeatable; default: any; a refused model's is logged)",
      [](C & c) -> auto& { return c.allowed_models; }));
  t.push_back(value<C>(
                  "min-device-blocks", "N",
                  "refuse a route keeping fewer blocks on this device (one whose device blocks hold no parameters is "
                  "always refused)",
                  [](C & c) -> auto& { return c.min_device_blocks; })
                  .in(CLI::Range(0, 1000000)));
  t.push_back(schedule_option<C>(
      "emulated changes by round (text or file), e.g. 'at 3 link device-2 edge-1 10Mbit/s 40ms; at 2 slowdown "
      "device-2 4'"));
  push_metrics_options(t);
  t.push_back(idle_timeout_option<C>());
  t.push_back(give_up_option<C>());
  t.push_back(profile_every_option<C>(
      "steps between profiles sent upstream (and at once when the link's bandwidth moved by 1.5x)"));
  t.push_back(flag<C>(
      "equalise-cut-gradients",
      "U-shaped plans: every gradient sent up at the top cut rescaled to the micro-batch's RMS norm "
      "(the server cannot tell labels by norm); meant with the server's --label-groups",
      [](C & c) -> auto& { return c.equalise_cut_gradients; }));
  // Off (negative) by default: the docs show no default.
  t.push_back(parsed<C, double>(
                  "cut-gradient-noise", "S",
                  "U-shaped plans: noise on the gradients sent up at the top cut, S >= 0 (1: every sample's expected "
                  "norm the batch's largest; more hides directions too)",
                  [](C& c, const double& v) { c.cut_gradient_noise = v; },
                  [](const C& c) {
                    return c.cut_gradient_noise < 0 ? strings{} : strings{fmt::format("{}", c.cut_gradient_noise)};
                  })
                  .in(CLI::Range(0.0, 1000.0)));
  t.push_back(value<C>(
                  "activation-clip", "X", "clip each sample's activation at the bottom cut to this L2 norm (0: off)",
                  [](C & c) -> auto& { return c.activation_clip; })
                  .in(CLI::Range(0.0, 1e9)));
  t.push_back(value<C>(
                  "activation-noise", "SIGMA",
                  "Gaussian noise on the clipped activations, std SIGMA x the clip; epsilon logged every round",
                  [](C & c) -> auto& { return c.activation_noise; })
                  .in(CLI::Range(0.0, 1e6)));
  t.push_back(value<C>(
                  "dp-delta", "X", "delta of the epsilon the activation noise reports",
                  [](C & c) -> auto& { return c.dp_delta; })
                  .in(CLI::Range(1e-300, 0.5)));
  t.push_back(value<C>(
                  "nopeek", "X",
                  "weight of the distance correlation of inputs and cut activations in the device's loss (0: off)",
                  [](C & c) -> auto& { return c.nopeek; })
                  .in(CLI::Range(0.0, 1e6)));
  t.push_back(
      parsed<C>(
          "gradient-check", "MODE",
          "off, warn or refuse: gradients from upstream that do not follow the labels (a server steering "
          "this device's features)",
          [](C& c, const std::string& v) {
            c.gradient_check = v == "off"      ? device::gradient_check_mode::off
                               : v == "refuse" ? device::gradient_check_mode::refuse
                                               : device::gradient_check_mode::warn;
          },
          [](const C& c) {
            using m = device::gradient_check_mode;
            return strings{c.gradient_check == m::off ? "off" : c.gradient_check == m::refuse ? "refuse" : "warn"};
          })
          .in(CLI::IsMember({"off", "warn", "refuse"})));
  t.push_back(value<C>(
                  "gradient-check-window", "N", "micro-batches the gradient check averages",
                  [](C & c) -> auto& { return c.gradient_check_window; })
                  .in(CLI::Range(1, 1000000)));
  t.push_back(value<C>(
      "gradient-check-threshold", "X", "label alignment below which the gradient check alarms",
      [](C & c) -> auto& { return c.gradient_check_threshold; }));
  t.push_back(flag<C>(
      "secure-aggregation", "upload replicas only masked; refuse a server that does not aggregate securely",
      [](C & c) -> auto& { return c.secure_aggregation; }));
  t.push_back(value<C>(
                  "secagg-min-roster", "N",
                  "take part in secure aggregation only with rosters of at least N signed devices (default 3)",
                  [](C & c) -> auto& { return c.secagg_min_roster; })
                  .in(CLI::Range(2, 1000000)));
  t.push_back(augment_option<C>([](C & c) -> auto& { return c.augment; }));
  return t;
}

}  // namespace

server::server_config default_server_config() {
  return {};
}

edge::edge_config default_edge_config() {
  return {};
}

device::agent_config default_agent_config() {
  return {};
}

const option_table<server::server_config>& server_options() {
  static const auto t = make_server_options();
  return t;
}

const option_table<edge::edge_config>& edge_options() {
  static const auto t = make_edge_options();
  return t;
}

const option_table<device::agent_config>& agent_options() {
  static const auto t = make_agent_options();
  return t;
}

}  // namespace cleave::apps
