// `cleave demo`: a federation on loopback, a server, E edges and N devices, either each node a
// process of its own or the devices as virtual devices (threads of this process sharing one
// read-only data set, their block profiles and the cores, each with its own TLS channel). It ends with the
// figures of the run: join time, round time, and the memory of each kind of node.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "cleave/backend/registry.h"
#include "cleave/core/clock.h"
#include "cleave/device/agent.h"
#include "cleave/federation/local_federation.h"
#include "cleave/metrics/registry.h"
#include "cleave/transport/listener.h"
#include "commands.h"
#include "demo_board.h"
#include "node_options.h"

namespace cleave::apps {

namespace {

namespace fs = std::filesystem;
using clock = std::chrono::steady_clock;

// The demo's own options, and those it passes on to the server and to every device (options
// of their tables, with the demo's defaults).
struct demo_options {
  std::string work;
  int devices = 4, edges = 1;
  bool virtual_devices = false;
  std::string backend = "auto", data = "fashion-mnist";
  bool no_emulation = false, secure = false;
  bool no_compare = false;  // no second run on the first plan kept
  std::string device_backends;
  transport::emulation_schedule schedule;  // of every node
  int slow = 0;
  double slowdown = 1.0;
  bool emulate_board = false;  // set slowdown from this machine's speed and board_gflops
  double board_gflops = 4.0;
  bool board_given = false;     // --board-gflops set: emulated as given, not bounded by this machine
  bool deadline_given = false;  // --deadline set: kept whatever the emulated boards need
  server::server_config server;
  device::agent_config agent;

  demo_options() {
    server.rounds = 8;
    server.local_steps = 150;
    server.opt.lr = 0.05f;
    agent.partition = core::parse_partition("dirichlet:0.5");
  }
};

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

// The data every node reads. A gzipped IDX set is unpacked once into the work directory, so
// that each of many nodes streams plain files instead of inflating the whole training split.
std::string demo_data(const std::string& data, const fs::path& work) {
  const fs::path dir = data == "fashion-mnist" ? fs::path(core::fashion_mnist_dir) : fs::path(data);
  const char* names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                         "t10k-labels-idx1-ubyte"};
  std::error_code ec;
  for (const char* n : names)
    if (!fs::exists(dir / (std::string(n) + ".gz"), ec)) return data;  // another layout: as it is
  const fs::path out = work / "data";
  fs::create_directories(out);
  for (const char* n : names) {
    const fs::path to = out / n;
    if (fs::exists(to, ec)) continue;
    const std::string from = (dir / (std::string(n) + ".gz")).string();
    gzFile in = gzopen(from.c_str(), "rb");
    if (!in) throw core::error("data file '" + from + "': cannot open");
    std::ofstream f(to.string() + ".part", std::ios::binary);
    std::vector<char> buf(1 << 20);
    int got = 0;
    while ((got = gzread(in, buf.data(), static_cast<unsigned>(buf.size()))) > 0) f.write(buf.data(), got);
    gzclose(in);
    if (got < 0 || !f.flush()) throw core::error("data file '" + from + "': cannot unpack it into " + out.string());
    f.close();
    fs::rename(to.string() + ".part", to);
  }
  return out.string();
}

// All nodes share this machine's cores: each oneDNN node gets its share of threads (OpenMP
// teams of competing processes stall each other).
std::string node_backend(const std::string& b, int n_nodes) {
  if (b == "onednn" || (b == "auto" && backend::resolve_auto() == "onednn")) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    return "onednn:" + std::to_string(std::max(1u, cores / static_cast<unsigned>(n_nodes)));
  }
  return b;
}

struct demo_plan {
  fs::path work, certs;
  std::string data, level, server_addr;
  std::vector<std::string> edge_addrs;  // edge-1 .. edge-E
  std::string backend;                  // of the server and the edges
  std::vector<std::string> device_backends;
};

// The server the demo starts: the options passed on, and where it listens, what it reads and writes.
server::server_config demo_server(const demo_options& o, const demo_plan& p) {
  server::server_config c = o.server;
  c.certs = p.certs;
  std::tie(c.listen_host, c.port) = host_port(p.server_addr, "--listen");
  c.data = p.data;
  c.backend = p.backend;
  c.min_devices = o.devices;
  c.checkpoint = p.work / "global.ckpt";
  c.run_log = p.work / "rounds.jsonl";
  c.fresh = c.force = true;  // every demo is a run of its own
  c.secure_aggregation = o.secure;
  c.schedule = o.schedule;
  return c;
}

edge::edge_config demo_edge(const demo_options& o, const demo_plan& p, int e) {
  edge::edge_config c;
  c.certs = p.certs;
  c.name = "edge-" + std::to_string(e);
  std::tie(c.listen_host, c.port) = host_port(p.edge_addrs[static_cast<std::size_t>(e - 1)], "--listen");
  std::tie(c.upstream_host, c.upstream_port) = host_port(p.server_addr, "--server");
  c.backend = p.backend;
  c.schedule = o.schedule;
  return c;
}

// A node's command line: `cleave --log-level L COMMAND` and the options that make it read c.
template <class C>
std::vector<std::string> node_args(const demo_plan& p, const char* command, const option_table<C>& table, const C& c) {
  std::vector<std::string> a{"cleave", "--log-level", p.level, command};
  C defaults;
  defaults.name.clear();  // the name always written: ps and pkill find a node by it
  const auto rest = command_line(table, c, defaults);
  a.insert(a.end(), rest.begin(), rest.end());
  return a;
}

// Device i's upstream: edge ((i - 1) mod E) + 1, or the server without edges.
std::pair<std::string, std::string> upstream_of(const demo_plan& p, int i) {
  if (p.edge_addrs.empty()) return {p.server_addr, "server"};
  const std::size_t e = static_cast<std::size_t>(i - 1) % p.edge_addrs.size();
  return {p.edge_addrs[e], "edge-" + std::to_string(e + 1)};
}

// An emulated slow board on onednn runs the portable kernels: Winograd and the few-channel
// loops need AVX-512, which an arm64 board does not have.
std::string board_backend(const std::string& b) {
  return b.rfind("onednn:", 0) == 0 && b.find(',') == std::string::npos ? b + ",portable" : b;
}

// Device i's backend.
std::string device_backend(const demo_options& o, const demo_plan& p, int i) {
  const std::string& b = p.device_backends[static_cast<std::size_t>(i - 1) % p.device_backends.size()];
  return i <= o.slow && o.slowdown > 1.0 ? board_backend(b) : b;
}

// Device i, the same as a process of its own or as a virtual device (a device::agent on a thread
// of this process, which then sets its data source and shared board).
device::agent_config demo_agent(const demo_options& o, const demo_plan& p, int i) {
  device::agent_config c = o.agent;
  const auto [addr, name] = upstream_of(p, i);
  c.certs = p.certs;
  c.id = static_cast<std::uint32_t>(i);
  c.name = "device-" + std::to_string(i);
  std::tie(c.upstream_host, c.upstream_port) = host_port(addr, "--connect");
  c.upstream_name = name;
  c.backend = device_backend(o, p, i);
  c.data = p.data;
  c.n_shards = o.devices;
  c.shard = i - 1;
  c.schedule = o.schedule;
  c.secure_aggregation = o.secure;
  // Its rosters are as large as the server's rule for a block's sum asks.
  c.secagg_min_roster = std::min(c.secagg_min_roster, o.server.secagg_min_holders);
  if (i <= o.slow) c.slowdown = o.slowdown;
  return c;
}

// The virtual devices, started a few at a time (the server takes only so many handshakes from
// one address at once), each on its own thread.
class virtual_devices {
 public:
  virtual_devices(const demo_options& o, const demo_plan& p) {
    core::load_options lo;
    lo.test = false;
    auto data = std::make_shared<core::dataset>(std::move(core::load_dataset(p.data, lo).train));
    auto board =
        std::make_shared<runtime::shared_board>(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    // A device's first frame goes out once its handshake is done: at most `in_flight` devices
    // are handshaking at a time, however slowly a loaded machine completes them.
    constexpr int in_flight = 8;
    for (int i = 1; i <= o.devices; ++i) {
      auto c = demo_agent(o, p, i);
      c.source = data;
      c.shared_board = board;
      c.on_send = [this, first = std::make_shared<std::once_flag>()](std::span<const std::byte>) {
        std::call_once(*first, [this] {
          std::lock_guard lock(mu_);
          ++connected_;
          cv_.notify_all();
        });
      };
      agents_.push_back(std::make_unique<device::agent>(c));
    }
    threads_.reserve(agents_.size());
    bool paced = true;
    for (std::size_t i = 0; i < agents_.size(); ++i) {
      if (paced) {
        // 10 s without a handshake done (the server gone?): the devices' own retries take over.
        std::unique_lock lock(mu_);
        paced =
            cv_.wait_for(lock, std::chrono::seconds(10), [&] { return static_cast<int>(i) - connected_ < in_flight; });
      }
      threads_.emplace_back([this, i] {
        try {
          agents_[i]->run();
        } catch (const std::exception& e) {
          spdlog::error("device {}: {}", i + 1, e.what());
        }
      });
    }
  }
  ~virtual_devices() { stop(); }
  // After the server has ended the run: the devices end by themselves; any left are stopped.
  void stop() {
    for (auto& a : agents_) a->stop();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int connected_ = 0;  // devices that have sent a frame
  std::vector<std::unique_ptr<device::agent>> agents_;
  std::vector<std::thread> threads_;
};

// Waits until a node listens on addr ("127.0.0.1:PORT"): the devices start once the server and
// the edges are up, so that their start-up (and the server's block profile) is not measured
// under the load of hundreds of starting processes. False when the process ended first.
bool wait_listening(pid_t pid, const std::string& addr) {
  const auto port = static_cast<std::uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1)));
  const auto until = clock::now() + std::chrono::seconds(120);
  while (clock::now() < until) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid)
      return false;  // left for wait_for_demo to reap
    // A listening socket on the port (/proc/net/tcp: local address, state 0A): no connection
    // made, so nothing for the node to log as a refused handshake.
    std::ifstream tcp("/proc/net/tcp");
    const std::string want = fmt::format(":{:04X}", port);
    bool up = false;
    for (std::string line; !up && std::getline(tcp, line);) {
      std::istringstream f(line);
      std::string sl, local, remote, state;
      f >> sl >> local >> remote >> state;
      up = local.size() > want.size() && local.ends_with(want) && state == "0A";
    }
    if (up) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;  // the devices' own retries take over
}

struct node_usage {
  std::vector<long> device_kib, edge_kib;  // peak RSS of each process
  long server_kib = 0;
};

// Waits for the server, then gives the other nodes a moment to end (the server tells them
// training is over) before stopping them; returns the server's wait status. An edge or a device
// that fails before the server ends (its error is in its log) stops every node: the server would
// wait for it to the end of its join timeout.
int wait_for_demo(pid_t server, const std::vector<pid_t>& edges, const std::vector<pid_t>& devices, node_usage& u) {
  static std::vector<pid_t> all;
  all = edges;
  all.insert(all.end(), devices.begin(), devices.end());
  all.push_back(server);
  auto forward = [](int sig) {
    for (pid_t p : all) ::kill(p, sig);
  };
  std::signal(SIGINT, forward);
  std::signal(SIGTERM, forward);
  int status = 0;
  rusage ru{};
  std::map<pid_t, long> early;  // nodes reaped before the server: their peak RSS
  bool failed = false;
  for (;;) {
    int st = 0;
    rusage r{};
    const pid_t p = ::wait4(-1, &st, 0, &r);
    if (p < 0) {
      if (errno == EINTR) continue;
      break;  // no child left
    }
    if (p == server) {
      status = st;
      ru = r;
      break;
    }
    if (std::find(all.begin(), all.end(), p) == all.end()) continue;
    early[p] = r.ru_maxrss;
    if ((!WIFEXITED(st) || WEXITSTATUS(st) != 0) && !failed) {
      failed = true;
      const bool edge = std::find(edges.begin(), edges.end(), p) != edges.end();
      spdlog::error(
          "demo: {} (pid {}) failed ({}) before training finished: see its log; stopping every node",
          edge ? "an edge" : "a device", p,
          WIFEXITED(st) ? fmt::format("exit status {}", WEXITSTATUS(st)) : fmt::format("signal {}", WTERMSIG(st)));
      forward(SIGTERM);
    }
  }
  if (failed) status = 1 << 8;  // the run failed whatever the server's own status
  u.server_kib = ru.ru_maxrss;
  const auto until = clock::now() + std::chrono::seconds(10);
  auto reap = [&](const std::vector<pid_t>& pids, std::vector<long>& kib) {
    for (pid_t p : pids) {
      if (const auto it = early.find(p); it != early.end()) {
        kib.push_back(it->second);
        continue;
      }
      int st = 0;
      rusage r{};
      while (::wait4(p, &st, WNOHANG, &r) == 0) {
        if (clock::now() > until) {
          ::kill(p, SIGKILL);
          ::wait4(p, &st, 0, &r);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      kib.push_back(r.ru_maxrss);
    }
  };
  reap(devices, u.device_kib);
  reap(edges, u.edge_kib);
  return status;
}

std::string mib(double kib) {
  return fmt::format("{:.0f} MiB", kib / 1024.0);
}

std::string mean_max(const std::vector<long>& kib) {
  if (kib.empty()) return "-";
  double sum = 0;
  for (long k : kib) sum += static_cast<double>(k);
  return fmt::format("{} mean, {} max", mib(sum / static_cast<double>(kib.size())),
                     mib(static_cast<double>(*std::max_element(kib.begin(), kib.end()))));
}

// The rounds of the server's run log.
std::vector<nlohmann::json> read_rounds(const demo_plan& p) {
  std::ifstream in(p.work / "rounds.jsonl");
  std::vector<nlohmann::json> rounds;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rounds.push_back(nlohmann::json::parse(line, nullptr, false));
  std::erase_if(rounds, [](const nlohmann::json& j) { return !j.is_object() || !j.contains("started_at"); });
  return rounds;
}

// How long training took to reach a useful accuracy (the figure split learning is judged by).
constexpr double target_accuracy = 0.80;
struct time_to_target {
  int round = 0;  // 0: not reached
  double seconds = 0, best = 0;
  std::string text() const {
    return round ? fmt::format("reached in round {} after {:.1f} s of training", round, seconds)
                 : fmt::format("not reached (best {:.4f})", best);
  }
};

time_to_target reach(const std::vector<nlohmann::json>& rounds) {
  time_to_target t;
  double trained = 0;
  for (const auto& r : rounds) {
    trained += r["seconds"].get<double>();
    const auto it = r.find("test_accuracy");  // not evaluated every round with --eval-every
    const double acc = it != r.end() && it->is_number() ? it->get<double>() : 0.0;
    t.best = std::max(t.best, acc);
    if (!t.round && acc >= target_accuracy) {
      t.round = r.value("round", 0);
      t.seconds = trained;
    }
  }
  return t;
}

// What the run took: from the server's run log, the processes' peak memory and this process's.
time_to_target summarise(const demo_options& o, const demo_plan& p, double started_at, const node_usage& u) {
  const auto rounds = read_rounds(p);
  if (rounds.empty()) return {};
  const double join = rounds.front()["started_at"].get<double>() - started_at;
  double secs = 0;
  for (const auto& r : rounds) secs += r["seconds"].get<double>();
  spdlog::info("demo: {} {}devices, {}: joined in {:.1f} s; {} rounds, {:.2f} s per round", o.devices,
               o.virtual_devices ? "virtual " : "",
               p.edge_addrs.empty()
                   ? std::string("no edges")
                   : fmt::format("{} edge{}", p.edge_addrs.size(), p.edge_addrs.size() == 1 ? "" : "s"),
               join, rounds.size(), secs / static_cast<double>(rounds.size()));
  const time_to_target reached = reach(rounds);
  spdlog::info("demo: test accuracy {:.2f} {}", target_accuracy, reached.text());
  // The server's resident set at the end of each round, from round 3 on (after the first
  // rounds have sized its buffers).
  const std::size_t from = std::min<std::size_t>(2, rounds.size() - 1);
  double lo = 1e300, hi = 0;
  for (std::size_t r = from; r < rounds.size(); ++r) {
    const double b = rounds[r]["resident_bytes"].get<double>();
    lo = std::min(lo, b);
    hi = std::max(hi, b);
  }
  spdlog::info("demo: server resident {:.0f}-{:.0f} MiB over rounds {}-{} ({:+.1f}%), peak {}", lo / 1048576.0,
               hi / 1048576.0, from + 1, rounds.size(), (hi / lo - 1.0) * 100.0,
               mib(static_cast<double>(u.server_kib)));
  if (o.virtual_devices)
    spdlog::info("demo: devices: this process peaked at {} for {} devices ({:.1f} MiB each)",
                 mib(static_cast<double>(metrics::peak_resident_bytes()) / 1024.0), o.devices,
                 static_cast<double>(metrics::peak_resident_bytes()) / 1048576.0 / o.devices);
  else
    spdlog::info("demo: device processes peaked at {}", mean_max(u.device_kib));
  if (!u.edge_kib.empty()) spdlog::info("demo: edge processes peaked at {}", mean_max(u.edge_kib));
  return reached;
}

// Loopback addresses for the server and each edge, distinct.
void take_ports(demo_plan& p, int edges) {
  const auto ports = transport::free_loopback_ports(1 + edges);
  p.server_addr = "127.0.0.1:" + std::to_string(ports[0]);
  p.edge_addrs.clear();
  for (int e = 1; e <= edges; ++e)
    p.edge_addrs.push_back("127.0.0.1:" + std::to_string(ports[static_cast<std::size_t>(e)]));
}

demo_plan plan_demo(const demo_options& o) {
  demo_plan p;
  p.work =
      o.work.empty() ? fs::temp_directory_path() / ("cleave-demo-" + std::to_string(::getpid())) : fs::path(o.work);
  fs::create_directories(p.work);
  p.certs = p.work / "certs";
  p.data = demo_data(o.data, p.work);
  p.level = spdlog::level::to_string_view(spdlog::get_level()).data();
  take_ports(p, o.edges);
  // Virtual devices share this process's cores as threads: one each, as processes get.
  const int n_nodes = o.devices + o.edges + 1;
  p.backend = node_backend(o.backend, n_nodes);
  for (const auto& b : parse_backend_list(o.device_backends, "--device-backends"))
    p.device_backends.push_back(node_backend(b, n_nodes));
  if (p.device_backends.empty()) p.device_backends.push_back(p.backend);
  return p;
}

// The deployment the demo emulates unless told otherwise (--no-emulation; any of the options set
// explicitly wins): devices are boards that train the model at 4 GFLOP/s (--board-gflops): a
// Raspberry Pi 4 trains MobileNetV2 at about 4 GFLOP/s on its 4 cores and ResNet-18 at about 16
// (224x224, batch 16: 15.3 and 10.9 s per batch in Flower's federated-embedded-vision benchmark,
// 2023), and small layers of few channels, as LeNet-5's, run no faster than MobileNetV2's. The
// slowdown that makes this machine's device processes that slow is measured before the run
// (emulate_board), so the boards are as slow on a fast machine as on a slow one. They sit behind
// Wi-Fi-class links (50 Mbit/s, 5 ms each way) to their edge, which has a 1 Gbit/s, 0.5 ms link to the
// server. In rounds 3-5 the Wi-Fi degrades to 10 Mbit/s (802.11n at the edge of its range, or
// through walls) and from round 6 it is back: the splitter should move blocks onto the boards and
// back. The cut may be compressed (f16 or int8; top-k gradients cost accuracy, bench/codecs) and
// each step runs as 4 pipelined micro-batches.
void emulate_deployment(demo_options& o, const CLI::App& cmd) {
  if (o.no_emulation) return;
  if (!cmd.count("--slow")) o.slow = o.devices;
  if (!cmd.count("--slowdown")) o.emulate_board = true;
  if (!cmd.count("--codecs")) o.server.codecs = core::parse_codec_set("f16,int8");
  if (!cmd.count("--micro-batches")) o.server.micro_batches = 4;
  if (cmd.count("--schedule")) return;
  std::string s;
  const auto links = [&](int round, const char* wifi) {
    if (o.edges == 0) {
      s += fmt::format("at {} link * server {} 5ms; ", round, wifi);
      return;
    }
    for (int e = 1; e <= o.edges; ++e)
      s += fmt::format("at {0} link * edge-{1} {2} 5ms; at {0} link edge-{1} server 1Gbit/s 0.5ms; ", round, e, wifi);
  };
  links(1, "50Mbit/s");
  links(3, "10Mbit/s");
  links(6, "50Mbit/s");
  o.schedule = transport::parse_schedule(s);
}

// Starts the nodes of p and waits for them to end; throws when the run failed. The server's log
// (one line per round) goes to this terminal, or with quiet_server to server.log as the others'
// go to files.
node_usage run_nodes(const demo_options& o, const demo_plan& p, bool quiet_server) {
  const pid_t server = spawn(node_args(p, "server", server_options(), demo_server(o, p)),
                             quiet_server ? p.work / "server.log" : fs::path{});
  std::vector<pid_t> edges, devices;
  bool up = wait_listening(server, p.server_addr);
  for (int e = 1; e <= o.edges; ++e)
    edges.push_back(spawn(node_args(p, "edge", edge_options(), demo_edge(o, p, e)),
                          p.work / ("edge-" + std::to_string(e) + ".log")));
  for (int e = 1; up && e <= o.edges; ++e)
    up = wait_listening(edges[static_cast<std::size_t>(e - 1)], p.edge_addrs[static_cast<std::size_t>(e - 1)]);
  std::unique_ptr<virtual_devices> virt;
  auto terminal = spdlog::default_logger();
  if (!up) {
    // A node ended before it listened: its error is above (the server's) or in its log.
  } else if (o.virtual_devices) {
    // The devices' lines go to one file; this process's own to the terminal.
    auto file = spdlog::basic_logger_mt("devices", (p.work / "devices.log").string(), true);
    file->set_level(spdlog::get_level());
    spdlog::set_default_logger(file);
    try {
      virt = std::make_unique<virtual_devices>(o, p);
    } catch (...) {  // e.g. the data set: said on the terminal, and no node left running
      spdlog::set_default_logger(terminal);
      for (pid_t pid : edges) ::kill(pid, SIGTERM);
      ::kill(server, SIGTERM);
      node_usage ignored;
      wait_for_demo(server, edges, devices, ignored);
      throw;
    }
  } else {
    for (int i = 1; i <= o.devices; ++i)
      devices.push_back(spawn(node_args(p, "agent", agent_options(), demo_agent(o, p, i)),
                              p.work / ("device-" + std::to_string(i) + ".log")));
  }
  terminal->info("demo: started server (pid {}), {} edge{} and {} devices; their logs: {}/*.log", server, o.edges,
                 o.edges == 1 ? "" : "s", o.devices, p.work.string());
  node_usage u;
  const int status = wait_for_demo(server, edges, devices, u);
  if (virt) virt->stop();
  spdlog::set_default_logger(terminal);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw core::error("the run failed (see above; the nodes' logs are in " + p.work.string() + ")");
  return u;
}

// The same federation on the plan it started from, kept (--no-adapt): what the splitter is
// judged against. Splits do not change the math, so it reaches the target in about the same
// round; what differs is the time. It ends once it reaches the target, at the latest a round
// past the adaptive run's.
void compare_kept(const demo_options& o, const demo_plan& p, const time_to_target& adaptive) {
  demo_options k = o;
  server::server_config& ks = k.server;
  ks.adaptive = false;
  ks.dashboard.clear();
  ks.metrics.clear();
  if (adaptive.round) ks.rounds = std::min(o.server.rounds, adaptive.round + 1);
  if (!(ks.stop_at_accuracy > 0 && ks.stop_at_accuracy <= target_accuracy)) ks.stop_at_accuracy = target_accuracy;
  demo_plan kp = p;  // its certificates and data
  kp.work = p.work / "kept";
  fs::create_directories(kp.work);
  take_ports(kp, o.edges);
  spdlog::info("demo: now the plan it started from, kept, for comparison ({} round{}; logs in {})", ks.rounds,
               ks.rounds == 1 ? "" : "s", kp.work.string());
  run_nodes(k, kp, true);
  const auto rounds = read_rounds(kp);
  std::set<std::string> routes;
  if (!rounds.empty())
    for (const auto& r : rounds.front().value("routes", nlohmann::json::array())) routes.insert(r.value("route", ""));
  std::string plan;
  for (const auto& r : routes) plan += (plan.empty() ? "" : ", ") + r;
  const time_to_target kept = reach(rounds);
  spdlog::info("demo: the plan it started from ({}), kept: test accuracy {:.2f} {}", plan, target_accuracy,
               kept.text());
  if (kept.round && adaptive.round)
    spdlog::info("demo: adaptive splitting reached it {:.2f}x as fast ({:.1f} s against {:.1f} s)",
                 kept.seconds / adaptive.seconds, adaptive.seconds, kept.seconds);
}

// x to two significant digits, for {:g}.
double two_digits(double x) {
  const double unit = std::pow(10.0, std::floor(std::log10(x)) - 1);
  return std::round(x / unit) * unit;
}

// The emulation's line; with emulate_board first measures this machine and sets o.slowdown.
void announce_emulation(demo_options& o, const demo_plan& p) {
  const auto links = fmt::format(
      "Wi-Fi links to their {} (--no-emulation: as they are); cut codecs {}, {} "
      "micro-batches per step",
      o.edges ? "edge" : "server", o.server.codecs.str(), o.server.micro_batches);
  if (!o.emulate_board) {
    spdlog::info("demo: emulating {} boards {:g}x slower than this machine on {}", o.slow, o.slowdown, links);
    return;
  }
  const std::string b = board_backend(p.device_backends.front());
  // The server is this machine, one core of it, and serves every device: the boards train at
  // most an eighth of its speed for 4 devices (1 / (2 x devices)) unless --board-gflops says
  // otherwise. Without that bound a slow machine's server is no faster than the boards it serves,
  // and keeping every block on them is the right plan: the demo would show no split.
  const double at_most = o.board_given ? 0.0 : 1.0 / (2.0 * o.devices);
  const auto e = emulate_board(o.server.model, p.data, b, 64, o.board_gflops, at_most);
  o.slowdown = e.slowdown;
  // A round on the boards with every block on them takes local_steps of their steps; split
  // plans on a degraded link take longer. The server's default deadline (120 s) would abandon
  // every round of a model the boards take minutes to train a round of.
  const double board_round_s = e.step_ms / 1e3 * o.slowdown * o.server.local_steps;
  const bool raised = !o.deadline_given && 10 * board_round_s > o.server.round_deadline_s;
  if (raised) o.server.round_deadline_s = std::ceil(10 * board_round_s);
  spdlog::info(
      "demo: emulating {} boards that train {} at {:g} GFLOP/s (here {:.0f} GFLOP/s, a step {:.1f} ms on "
      "{}: --slowdown {:.1f}{}) on {}{}",
      o.slow, o.server.model, e.board_gflops < o.board_gflops ? two_digits(e.board_gflops) : o.board_gflops,
      e.host_gflops, e.step_ms, b, o.slowdown,
      e.board_gflops < o.board_gflops
          ? fmt::format("; not {:g} GFLOP/s, so that this machine's server is twice as fast as its {} boards",
                        o.board_gflops, o.devices)
          : std::string(),
      links,
      raised || o.deadline_given ? fmt::format("; round deadline {:.0f} s", o.server.round_deadline_s) : std::string());
}

void run_demo(demo_options o) {
  if (o.slow > o.devices) throw core::error("--slow " + std::to_string(o.slow) + ": more than --devices");
  const demo_plan p = plan_demo(o);
  if (!o.no_emulation) announce_emulation(o, p);
  spdlog::info("demo: 1 server, {} edge{}, {} {}devices on loopback; work directory {}", o.edges,
               o.edges == 1 ? "" : "s", o.devices, o.virtual_devices ? "virtual " : "", p.work.string());
  federation::provision_local(p.certs, o.devices, o.edges);
  spdlog::info("demo: certificates for the CA, server, {}device-1..{} in {}",
               o.edges ? fmt::format("edge-1..{}, ", o.edges) : std::string(), o.devices, p.certs.string());
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 0);  // idle OpenMP threads sleep
  const double started_at = core::unix_now();
  const time_to_target adaptive = summarise(o, p, started_at, run_nodes(o, p, false));
  // Sequential mode keeps its cuts (the splitter plans SplitFed rounds): a second run would be the same.
  if (!o.no_emulation && o.server.adaptive && !o.no_compare && o.server.mode != server::training_mode::sequential)
    compare_kept(o, p, adaptive);
  spdlog::info("demo: done; global model in {}, logs in {}", (p.work / "global.ckpt").string(), p.work.string());
}

const option_table<demo_options>& demo_table() {
  using D = demo_options;
  static const option_table<D> t = [] {
    const auto srv = [](D& d) -> server::server_config& { return d.server; };
    const auto dev = [](D& d) -> device::agent_config& { return d.agent; };
    const auto& so = server_options();
    const auto& ao = agent_options();
    option_table<D> t;
    t.push_back(value<D>(
        "work", "DIR", "work directory (default: a new one under /tmp)", [](D & d) -> auto& { return d.work; }));
    t.push_back(value<D>(
                    "devices", "N", "devices", [](D & d) -> auto& { return d.devices; })
                    .in(CLI::Range(1, 4096)));
    t.push_back(value<D>(
                    "edges", "N", "edges the devices connect through, in turn (0: straight to the server)",
                    [](D & d) -> auto& { return d.edges; })
                    .in(CLI::Range(0, 64)));
    t.push_back(flag<D>(
        "virtual",
        "run the devices as threads of this process (one data set, one block profile, a TLS channel "
        "each)",
        [](D & d) -> auto& { return d.virtual_devices; }));
    t.push_back(passed_on<D>(so, "rounds", srv));
    t.push_back(passed_on<D>(so, "local-steps", srv));
    t.push_back(passed_on<D>(ao, "partition", dev, "how the training set is split across devices"));
    t.push_back(value<D>(
        "backend", "NAME", "backend of every node", [](D & d) -> auto& { return d.backend; }));
    t.push_back(value<D>(
        "device-backends", "LIST",
        "backends of the devices, comma-separated, repeated over devices 1..N (default: --backend)",
        [](D & d) -> auto& { return d.device_backends; }));
    t.push_back(passed_on<D>(so, "mode", srv));
    t.push_back(passed_on<D>(so, "model", srv));
    t.push_back(value<D>(
        "data", "NAME|DIR", "data set", [](D & d) -> auto& { return d.data; }));
    for (const char* name : {"lr", "lr-schedule", "aggregate", "seed", "u-shape", "no-adapt"})
      t.push_back(passed_on<D>(so, name, srv));
    t.push_back(passed_on<D>(so, "deadline", srv,
                             "the server's round deadline in seconds (default: 120, or 10 rounds of the emulated "
                             "boards)"));
    t.push_back(passed_on<D>(so, "stop-at-accuracy", srv));
    t.push_back(flag<D>(
        "no-compare", "emulating, do not rerun the federation on its first plan kept to compare the time to 0.80",
        [](D & d) -> auto& { return d.no_compare; }));
    for (const char* name : {"min-device-blocks", "label-groups"}) t.push_back(passed_on<D>(so, name, srv));
    t.push_back(passed_on<D>(ao, "equalise-cut-gradients", dev));
    t.push_back(flag<D>(
        "secure-aggregation", "devices upload only masked replicas (see cleave server --help)",
        [](D & d) -> auto& { return d.secure; }));
    t.push_back(passed_on<D>(so, "secagg-min-holders", srv));
    for (const char* name : {"cuts", "edge-cuts"}) t.push_back(passed_on<D>(so, name, srv));
    t.push_back(flag<D>(
        "no-emulation",
        "run the nodes as they are (by default the demo emulates slow boards on Wi-Fi, see docs/getting-started.md)",
        [](D & d) -> auto& { return d.no_emulation; }));
    for (const char* name : {"micro-batches", "codecs"}) t.push_back(passed_on<D>(so, name, srv));
    t.push_back(parsed<D>(
        "schedule", "TEXT|FILE", "emulated heterogeneity by round, given to every node (text or file)",
        [](D& d, const std::string& v) { d.schedule = transport::parse_schedule(v); },
        [](const D& d) {
          return d.schedule.empty() ? std::vector<std::string>{} : std::vector<std::string>{d.schedule.text};
        }));
    t.push_back(value<D>(
                    "slow", "N", "devices 1..N run --slowdown times slower", [](D & d) -> auto& { return d.slow; })
                    .in(CLI::Range(0, 4096)));
    t.push_back(value<D>(
                    "slowdown", "X", "slowdown of the --slow devices", [](D & d) -> auto& { return d.slowdown; })
                    .in(CLI::Range(1.0, 1000.0)));
    t.push_back(value<D>(
                    "board-gflops", "X",
                    "emulating, the boards' training speed: sets --slowdown from this machine's, measured before "
                    "the run",
                    [](D & d) -> auto& { return d.board_gflops; })
                    .in(CLI::Range(0.01, 1e6)));
    for (const char* name : {"dashboard", "dashboard-token", "metrics", "metrics-token", "metrics-public"})
      t.push_back(passed_on<D>(so, name, srv));
    t.push_back(passed_on<D>(ao, "augment", dev));
    return t;
  }();
  return t;
}

}  // namespace

std::vector<option_doc> demo_option_docs() {
  return describe(demo_table(), demo_options{});
}

void register_demo_command(CLI::App& app) {
  static demo_options dm;
  auto* d = app.add_subcommand("demo", "a federation on loopback: a server, edges and N devices");
  add_options(*d, demo_table(), dm);
  d->callback([d] {
    dm.deadline_given = d->count("--deadline") > 0;
    dm.board_given = d->count("--board-gflops") > 0;
    emulate_deployment(dm, *d);
    run_demo(dm);
  });
}

}  // namespace cleave::apps
