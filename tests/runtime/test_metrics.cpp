// Metrics and the run log: the registry's exposition format and rules, and a federation (server,
// edge, two devices) scraped while it trains: every line is valid Prometheus text, every family
// typed, counters only grow, and the figures match what the server's rounds reported.
#include <doctest/doctest.h>
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "../support/chromium.h"
#include "../support/error_of.h"
#include "../support/run_cleave.h"
#include "cleave/metrics/exporter.h"
#include "cleave/metrics/registry.h"
#include "cleave/runtime/node_metrics.h"
#include "cleave/transport/listener.h"
#include "federation.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

// One scrape: series (name{labels}) -> value, and each family's TYPE. Fails the test on any line
// that is not a comment, a HELP/TYPE line or a sample as the text format 0.0.4 writes them.
struct scrape {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;
};

scrape parse_exposition(const std::string& text) {
  static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+)");
  static const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge))");
  static const std::regex sample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\["\\n])*",?)*\})? ([-+]?[0-9.eE+-]+|NaN|[+-]Inf))");
  scrape s;
  std::istringstream in(text);
  std::string line, helped;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, help)) {
      helped = m[1];
    } else if (std::regex_match(line, m, type)) {
      CHECK_MESSAGE(m[1] == helped, "TYPE without its HELP: " << line);
      s.types[m[1]] = m[2];
    } else if (std::regex_match(line, m, sample)) {
      const std::string name = m[1];
      CHECK_MESSAGE(s.types.count(name), "a sample of an undeclared family: " << line);
      const auto space = line.rfind(' ');
      s.samples[line.substr(0, space)] = std::stod(line.substr(space + 1));
    } else {
      FAIL_CHECK("not a line of the text format: '" << line << "'");
    }
  }
  return s;
}

std::string get_metrics(std::uint16_t port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(2, 0);
  c.set_read_timeout(5, 0);
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return {};
  return r->body;
}

}  // namespace

TEST_CASE("the registry writes the Prometheus text format and keeps its rules") {
  metrics::registry r;
  r.describe("cleave_things_total", metrics::kind::counter, "Things.\nSecond line \\ backslash.");
  r.describe("cleave_level", metrics::kind::gauge, "A level.");
  r.describe("cleave_unused", metrics::kind::gauge, "Never set: not written.");
  r.add("cleave_things_total", {{"peer", "a\"b\\c\nd"}}, 2);
  r.add("cleave_things_total", {{"peer", "a\"b\\c\nd"}});
  r.set("cleave_level", {}, 0.25);
  r.raise_to("cleave_things_total", {{"peer", "x"}}, 10);
  r.raise_to("cleave_things_total", {{"peer", "x"}}, 4);  // never back
  CHECK(r.render() ==
        "# HELP cleave_level A level.\n# TYPE cleave_level gauge\ncleave_level 0.25\n"
        "# HELP cleave_things_total Things.\\nSecond line \\\\ backslash.\n# TYPE cleave_things_total counter\n"
        "cleave_things_total{peer=\"a\\\"b\\\\c\\nd\"} 3\ncleave_things_total{peer=\"x\"} 10\n");
  CHECK(r.value("cleave_things_total", {{"peer", "x"}}) == 10);
  r.erase("cleave_level", {});
  CHECK(r.render().find("cleave_level") == std::string::npos);

  CHECK_THROWS_WITH_AS(r.describe("cleave_things", metrics::kind::counter, "x"),
                       doctest::Contains("must end in _total"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(r.describe("cleave_level_total", metrics::kind::gauge, "x"),
                       doctest::Contains("must not end in _total"), std::invalid_argument);
  CHECK_THROWS_AS(r.describe("cleave-bad", metrics::kind::gauge, "x"), std::invalid_argument);
  CHECK_THROWS_AS(r.describe("other_name", metrics::kind::gauge, "x"), std::invalid_argument);
  CHECK_THROWS_AS(r.describe("cleave_level", metrics::kind::gauge, "another help"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(r.add("cleave_things_total", {}, -1), doctest::Contains("cannot grow by -1"),
                       std::invalid_argument);
  CHECK_THROWS_AS(r.add("cleave_things_total", {}, std::nan("")), std::invalid_argument);
  CHECK_THROWS_WITH_AS(r.set("cleave_things_total", {}, 1), doctest::Contains("is a counter"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(r.set("cleave_nothing", {}, 1), doctest::Contains("not declared"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(r.set("cleave_level", {{"__reserved", "x"}}, 1), doctest::Contains("label name"),
                       std::invalid_argument);
  CHECK_THROWS_AS(r.set("cleave_level", {{"1st", "x"}}, 1), std::invalid_argument);
}

TEST_CASE("--metrics takes PORT (loopback), HOST:PORT or [IPV6]:PORT and names itself when it is neither") {
  using metrics::parse_listen_address;
  CHECK(parse_listen_address("9100", "--metrics") == std::pair<std::string, std::uint16_t>{"127.0.0.1", 9100});
  CHECK(parse_listen_address("0.0.0.0:9100", "--metrics") == std::pair<std::string, std::uint16_t>{"0.0.0.0", 9100});
  CHECK(parse_listen_address("[::1]:9100", "--metrics") == std::pair<std::string, std::uint16_t>{"::1", 9100});
  for (const char* bad : {"", "host:", ":9100", "9100x", "70000", "[::1]9100", "[::1", "host:123456"})
    CHECK_THROWS_WITH_AS(parse_listen_address(bad, "--metrics"), doctest::Contains("--metrics: '"),
                         std::invalid_argument);
  // A port another socket holds: an error naming the option and the address.
  metrics::registry r;
  metrics::exporter first(r, "0");
  const std::string taken = "127.0.0.1:" + std::to_string(first.port());
  const std::string expected = "--metrics: cannot listen on " + taken;
  CHECK_THROWS_WITH_AS(metrics::exporter(r, taken), doctest::Contains(expected.c_str()), std::runtime_error);
  // Anything but /metrics is not found.
  httplib::Client c("127.0.0.1", first.port());
  auto res = c.Get("/");
  REQUIRE(res);
  CHECK(res->status == 404);
}

TEST_CASE("a node's counters are there at 0 from the start, the labelled ones over the values they take") {
  metrics::registry r;
  runtime::declare_node_metrics(r);
  const auto s = parse_exposition(r.render());
  for (const char* name : {"cleave_rounds_completed_total", "cleave_steps_total", "cleave_resplits_total",
                           "cleave_checkpoint_failures_total", "cleave_frames_dropped_total"}) {
    CAPTURE(name);
    REQUIRE(s.samples.count(name) == 1);
    CHECK(s.samples.at(name) == 0);
  }
  for (const char* why : {"revoked", "hello", "admission", "message", "upload", "upstream", "secagg"})
    CHECK(s.samples.at(std::string("cleave_refusals_total{reason=\"") + why + "\"}") == 0);
  CHECK(s.samples.at("cleave_compute_seconds_total{tier=\"server\"}") == 0);
  // Gauges are facts: none before they are measured.
  CHECK(s.samples.count("cleave_round") == 0);
  CHECK(s.types.count("cleave_round") == 0);
}

TEST_CASE("/metrics carries the process_* families every Prometheus client exports, in the text format") {
  metrics::registry r;
  r.describe("cleave_things_total", metrics::kind::counter, "Things.");
  r.add("cleave_things_total", {});
  metrics::exporter e(r, "0");
  // Some CPU time first, more than one clock tick: the counter shows it.
  for (volatile double x = 0; std::clock() < CLOCKS_PER_SEC / 20;) x = x + 1;
  const auto s = parse_exposition(get_metrics(e.port()));
  CHECK(s.samples.at("cleave_things_total") == 1);
  for (const char* name :
       {"process_cpu_seconds_total", "process_max_fds", "process_open_fds", "process_resident_memory_bytes",
        "process_start_time_seconds", "process_virtual_memory_bytes"}) {
    CAPTURE(name);
    REQUIRE(s.samples.count(name) == 1);
    CHECK(s.types.at(name) == (std::string(name).ends_with("_total") ? "counter" : "gauge"));
  }
  CHECK(s.samples.at("process_cpu_seconds_total") > 0);
  CHECK(s.samples.at("process_open_fds") >= 3);
  CHECK(s.samples.at("process_open_fds") <= s.samples.at("process_max_fds"));
  // Within a factor of two of what /proc/self/status says, and started within the last day.
  const double rss = static_cast<double>(metrics::resident_bytes());
  CHECK(s.samples.at("process_resident_memory_bytes") > 0.5 * rss);
  CHECK(s.samples.at("process_resident_memory_bytes") < 2 * rss);
  CHECK(s.samples.at("process_virtual_memory_bytes") >= s.samples.at("process_resident_memory_bytes"));
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  CHECK(s.samples.at("process_start_time_seconds") <= now + 2);
  CHECK(s.samples.at("process_start_time_seconds") > now - 86400);
}

TEST_CASE(
    "a federation's nodes export metrics that parse, only grow where counted, and match its rounds, and the run "
    "log has one line per round") {
  const std::string be = test_backend();
  workspace w("metrics", 2, 1024, 256);
  const auto metrics_ports = transport::free_loopback_ports(3);
  const std::uint16_t server_metrics = metrics_ports[0];
  const std::uint16_t agent_metrics = metrics_ports[1];
  const std::uint16_t edge_metrics = metrics_ports[2];
  auto sc = server_cfg(w, be);
  sc.rounds = 4;
  sc.local_steps = 30;
  sc.batch = 16;
  sc.min_devices = 2;
  sc.edge_cuts = {3, 7};
  sc.metrics = std::to_string(server_metrics);
  sc.run_log = w.dir / "run.jsonl";
  std::vector<server::round_report> reports;
  std::promise<std::uint16_t> port;
  record(sc, reports, port);
  server::server_node srv(sc);
  std::atomic<bool> finished{false};
  runner rs([&] {
    struct mark {
      std::atomic<bool>& f;
      ~mark() { f = true; }
    } m{finished};
    srv.run();
  });
  const std::uint16_t p = port.get_future().get();
  auto edge = start_edge(w, be, p, [&](edge::edge_config& ec) { ec.metrics = std::to_string(edge_metrics); });
  auto a1 = agent_cfg(w, 1, edge.port, be, "edge-1");
  a1.metrics = "127.0.0.1:" + std::to_string(agent_metrics);
  device::agent d1(a1);
  runner r1([&] { d1.run(); });
  device::agent d2(agent_cfg(w, 2, edge.port, be, "edge-1"));
  runner r2([&] { d2.run(); });

  // Scrape both while it trains, until the server has finished (its endpoint then closes).
  std::vector<scrape> server_scrapes, agent_scrapes;
  std::map<std::string, std::string> texts;  // node -> its last scrape, for promtool
  while (!finished) {
    const std::string s = get_metrics(server_metrics), a = get_metrics(agent_metrics), e = get_metrics(edge_metrics);
    if (!s.empty()) server_scrapes.push_back(parse_exposition(s));
    if (!a.empty()) agent_scrapes.push_back(parse_exposition(a));
    for (const auto& [node, text] : {std::pair{"server", s}, {"agent", a}, {"edge", e}})
      if (!text.empty()) texts[node] = text;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(get_metrics(server_metrics).empty());
  rs.join();
  r1.join();
  r2.join();
  edge.node->stop();
  edge.thread->join();
  REQUIRE(rs.error() == "");
  REQUIRE(reports.size() == 4);
  REQUIRE(server_scrapes.size() >= 2);
  REQUIRE(agent_scrapes.size() >= 2);
  REQUIRE(texts.size() == 3);

  // Prometheus's own linter on every node's exposition (Debian's prometheus package; the test
  // script requires it, elsewhere this part is skipped without it).
  if (const std::string promtool = first_executable({"/usr/bin/promtool", "/usr/local/bin/promtool"});
      !promtool.empty()) {
    for (const auto& [node, text] : texts) {
      const fs::path file = w.dir / (node + ".prom");
      std::ofstream(file) << text;
      const auto lint = run_program("/bin/sh", {"-c", promtool + " check metrics < '" + file.string() + "' 2>&1"});
      CHECK_MESSAGE(lint.status == 0, node << ": promtool check metrics: " << lint.output);
    }
  } else if (std::getenv("CLEAVE_REQUIRE_PROMTOOL")) {
    FAIL("promtool is not installed (Debian's prometheus package)");
  } else {
    MESSAGE("promtool not installed: its check of the expositions is left out");
  }

  // Types, and counters never going back between scrapes.
  for (const auto* scrapes : {&server_scrapes, &agent_scrapes})
    for (std::size_t i = 0; i < scrapes->size(); ++i)
      for (const auto& [family, type] : (*scrapes)[i].types) {
        // cleave's own, and the process_* families of every Prometheus client.
        CHECK_MESSAGE((family.rfind("cleave_", 0) == 0 || family.rfind("process_", 0) == 0), family);
        CHECK_MESSAGE((type == "counter") == (family.size() > 6 && family.substr(family.size() - 6) == "_total"),
                      family << " is a " << type);
        if (type != "counter" || i == 0) continue;
        for (const auto& [series, v] : (*scrapes)[i - 1].samples)
          if (series.rfind(family, 0) == 0 && (*scrapes)[i].samples.count(series))
            CHECK_MESSAGE((*scrapes)[i].samples.at(series) >= v,
                          series << " went from " << v << " to " << (*scrapes)[i].samples.at(series));
      }

  // The server's last scrape against the rounds it had closed by then.
  const auto& last = server_scrapes.back().samples;
  REQUIRE(last.count("cleave_rounds_completed_total"));
  const auto k = static_cast<std::size_t>(last.at("cleave_rounds_completed_total"));
  REQUIRE(k >= 1);
  REQUIRE(k <= reports.size());
  CHECK(last.at("cleave_round") == static_cast<double>(k));
  CHECK(last.at("cleave_devices_connected") == 2);
  CHECK(last.at("cleave_devices_participating") == 2);
  CHECK(last.at("cleave_test_accuracy") == doctest::Approx(reports[k - 1].test_accuracy));
  CHECK(last.at("cleave_evaluations_total") == static_cast<double>(k));
  CHECK(last.at("cleave_link_up{peer=\"edge-1\"}") == 1);
  CHECK(last.at("cleave_link_sent_bytes_total{peer=\"edge-1\"}") > 0);
  CHECK(last.at("cleave_link_received_bytes_total{peer=\"edge-1\"}") > 0);
  CHECK(last.at("cleave_process_resident_memory_bytes") > 1e6);
  double device_s = 0;
  for (std::size_t i = 0; i < k; ++i) device_s += reports[i].device_compute_s;
  CHECK(last.at("cleave_compute_seconds_total{tier=\"device\"}") == doctest::Approx(device_s));
  // Each device's route as blocks per tier: 3 on the device, 4 on the edge, 5 on the server.
  for (const char* dev : {"1", "2"}) {
    const std::string d = std::string("cleave_device_blocks{device=\"") + dev + "\",tier=\"";
    CHECK(last.at(d + "device\"}") == 3);
    CHECK(last.at(d + "edge\"}") == 4);
    CHECK(last.at(d + "server\"}") == 5);
  }
  // The device's: its steps and its link to the edge.
  const auto& dev = agent_scrapes.back().samples;
  CHECK(dev.at("cleave_steps_total") >= 30);
  CHECK(dev.at("cleave_link_up{peer=\"edge-1\"}") == 1);
  CHECK(dev.at("cleave_connections_total") >= 1);

  // The run log: one JSON object per round, the round's figures.
  std::ifstream log(sc.run_log);
  std::string line;
  std::vector<nlohmann::json> lines;
  while (std::getline(log, line)) lines.push_back(nlohmann::json::parse(line));
  REQUIRE(lines.size() == reports.size());
  for (std::size_t i = 0; i < lines.size(); ++i) {
    CHECK(lines[i]["round"] == reports[i].round);
    CHECK(lines[i]["devices"] == reports[i].n_devices);
    CHECK(lines[i]["test_accuracy"].get<double>() == doctest::Approx(reports[i].test_accuracy));
    REQUIRE(lines[i]["routes"].size() == 2);
    CHECK(lines[i]["routes"][0]["route"] == "device[0,3) edge[3,7) server[7,12)");
  }
}

TEST_CASE("a run log that cannot be written is refused before the server listens, naming it") {
  workspace w("runlog", 1, 64, 32);
  auto sc = server_cfg(w, test_backend());
  sc.run_log = w.dir / "no-such-dir" / "run.jsonl";
  bool listened = false;
  sc.on_listening = [&](std::uint16_t) { listened = true; };
  server::server_node srv(sc);
  CHECK(error_of([&] { srv.run(); }) == "--run-log '" + sc.run_log.string() + "': cannot open it for writing");
  CHECK_FALSE(listened);
}
