// The server's dashboard, opened in a real browser: a federation (server, edge, three devices, two
// of them behind the edge) trains with the dashboard on; headless Chromium loads the page and
// its DOM must show every device, the current round, and for each device the route the server's
// plan gives it, block by block; a screenshot is kept as the test's artefact. Also: the token
// rules. Without Chromium the browser test is skipped (exit 77), unless CLEAVE_REQUIRE_BROWSER
// is set (the test script sets it: there Chromium is installed).
#include <doctest/doctest.h>
#include <httplib.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "../support/chromium.h"
#include "../support/error_of.h"
#include "cleave/transport/listener.h"
#include "federation.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

struct shown_device {
  std::string route;
  bool connected = false;
  std::map<std::string, int> blocks;  // tier -> blocks its bar colours so
};

// The device rows of the dumped DOM, by device id.
std::map<int, shown_device> devices_in(const std::string& dom) {
  std::map<int, shown_device> out;
  static const std::regex row(
      R"re(<tr class="device" data-device="(\d+)" data-route="([^"]*)" data-connected="([01])"[^>]*>([\s\S]*?)</tr>)re");
  static const std::regex block(R"re(class="block [a-z]+-tier" data-block="\d+" data-tier="([a-z]+)")re");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), row); it != std::sregex_iterator(); ++it) {
    auto& d = out[std::stoi((*it)[1])];
    d.route = (*it)[2];
    d.connected = (*it)[3] == "1";
    const std::string cells = (*it)[4];
    for (auto b = std::sregex_iterator(cells.begin(), cells.end(), block); b != std::sregex_iterator(); ++b)
      ++d.blocks[(*b)[1]];
  }
  return out;
}

}  // namespace

TEST_CASE("the dashboard in headless Chromium shows every device, the round and each device's planned route") {
  const std::string browser = require_chromium();
  const std::string be = test_backend();
  workspace w("dashboard", 3, 1024, 256);
  const std::uint16_t dash = transport::free_loopback_port();
  const std::string token = "t0ken-for-the-test";
  auto sc = server_cfg(w, be);
  sc.rounds = 1000;  // stopped when the checks are done
  sc.local_steps = 8;
  sc.batch = 16;
  sc.min_devices = 3;
  sc.cuts = {4};
  sc.edge_cuts = {3, 7};
  sc.eval_samples = 64;
  sc.dashboard = "127.0.0.1:" + std::to_string(dash);
  sc.dashboard_token = token;
  std::vector<server::round_report> reports;
  std::atomic<int> closed{0};
  std::promise<std::uint16_t> port;
  record(sc, reports, port);
  sc.on_round = [&](const server::round_report& r) {
    reports.push_back(r);
    ++closed;
  };
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  const std::uint16_t p = port.get_future().get();
  auto edge = start_edge(w, be, p);
  device::agent d1(agent_cfg(w, 1, edge.port, be, "edge-1"));
  runner r1([&] { d1.run(); });
  device::agent d2(agent_cfg(w, 2, edge.port, be, "edge-1"));
  runner r2([&] { d2.run(); });
  device::agent d3(agent_cfg(w, 3, p, be, "server"));
  runner r3([&] { d3.run(); });
  for (int i = 0; i < 1200 && closed < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(closed >= 2);

  // The token: required on every path, in the query or as a bearer header.
  httplib::Client http("127.0.0.1", dash);
  for (const char* path : {"/", "/api/state", "/?token=wrong"}) {
    auto res = http.Get(path);
    REQUIRE(res);
    CHECK_MESSAGE(res->status == 401, path);
  }
  auto api = http.Get("/api/state", {{"Authorization", "Bearer " + token}});
  REQUIRE(api);
  REQUIRE(api->status == 200);
  const auto state = nlohmann::json::parse(api->body);
  CHECK(state["model"] == "lenet5");
  CHECK(state["devices"].size() == 3);
  CHECK(state["edges"].size() == 1);

  // The page as the browser made it.
  const std::string url = "http://127.0.0.1:" + std::to_string(dash) + "/?token=" + token;
  const int before = closed;
  const std::string dom = chromium(browser, w.dir / "browser", "--dump-dom", url);
  const int after = closed;
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(dom, m, std::regex(R"re(<body data-round="(\d+)")re")), dom.substr(0, 2000));
  const int shown_round = std::stoi(m[1]);
  CHECK(shown_round >= before);
  CHECK(shown_round <= after);
  REQUIRE(std::regex_search(dom, m, std::regex(R"re(<b id="round">(\d+)</b>)re")));
  CHECK(std::stoi(m[1]) == shown_round);
  CHECK(dom.find(">edge-1</text>") != std::string::npos);  // in the topology
  CHECK(dom.find(">server</text>") != std::string::npos);
  const auto shown = devices_in(dom);

  // A screenshot, kept.
  const fs::path shot = fs::path(CLEAVE_ARTIFACTS_DIR) / "dashboard.png";
  fs::create_directories(shot.parent_path());
  fs::remove(shot);
  chromium(browser, w.dir / "browser", "--screenshot=" + shot.string(), url);
  REQUIRE(fs::exists(shot));
  CHECK(fs::file_size(shot) > 20000);
  std::ifstream png(shot, std::ios::binary);
  char magic[8] = {};
  png.read(magic, 8);
  CHECK(std::string(magic + 1, 3) == "PNG");
  MESSAGE("screenshot: " << shot.string());

  srv.stop();
  rs.join();
  r1.join();
  r2.join();
  r3.join();
  edge.node->stop();
  edge.thread->join();
  REQUIRE(rs.error() == "");

  // Every device, with the route of the server's plan in the round shown: its text and its
  // blocks by tier.
  REQUIRE(shown_round >= 1);
  REQUIRE(static_cast<std::size_t>(shown_round) <= reports.size());
  const auto& planned = reports[static_cast<std::size_t>(shown_round) - 1].routes;
  REQUIRE(planned.size() == 3);
  REQUIRE(shown.size() == 3);
  for (const auto& [id, route] : planned) {
    REQUIRE(shown.count(static_cast<int>(id)));
    const auto& d = shown.at(static_cast<int>(id));
    CHECK(d.connected);
    CHECK(d.route == route);
  }
  CHECK(shown.at(1).route == "device[0,3) edge[3,7) server[7,12)");
  CHECK(shown.at(1).blocks == std::map<std::string, int>{{"device", 3}, {"edge", 4}, {"server", 5}});
  CHECK(shown.at(2).blocks == std::map<std::string, int>{{"device", 3}, {"edge", 4}, {"server", 5}});
  CHECK(shown.at(3).route == "device[0,4) server[4,12)");
  CHECK(shown.at(3).blocks == std::map<std::string, int>{{"device", 4}, {"server", 8}});
}

TEST_CASE("a dashboard beyond loopback without a token is refused before the server listens") {
  workspace w("dashboard-open", 1, 64, 32);
  auto sc = server_cfg(w, test_backend());
  sc.dashboard = "0.0.0.0:0";
  bool listened = false;
  sc.on_listening = [&](std::uint16_t) { listened = true; };
  server::server_node srv(sc);
  CHECK(error_of([&] { srv.run(); }) ==
        "--dashboard 0.0.0.0:0: serving beyond loopback needs a token (--dashboard-token)");
  CHECK_FALSE(listened);
}

TEST_CASE("a dashboard on loopback without a token answers, and anything else is not found") {
  metrics::http_server s("0", {metrics::page{"/", "text/plain", [] { return std::string("hello"); }}},
                         metrics::http_options{"--dashboard"});
  httplib::Client c("127.0.0.1", s.port());
  auto ok = c.Get("/");
  REQUIRE(ok);
  CHECK(ok->status == 200);
  CHECK(ok->body == "hello");
  auto missing = c.Get("/metrics");
  REQUIRE(missing);
  CHECK(missing->status == 404);
}
