// The HTTP ports (/metrics, the dashboard) against clients that stall them and floods that would
// take the descriptors a node's TLS listener needs, with the real binary; and their rules for
// tokens, methods and oversized requests.
#include <doctest/doctest.h>
#include <httplib.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "cleave/metrics/exporter.h"
#include "nodes.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

// Connections that send a request's head one byte every `every` (slowloris), from 8 addresses.
class trickle {
 public:
  trickle(std::uint16_t port, int n, std::chrono::milliseconds every) {
    for (int i = 0; i < n; ++i) {
      const int fd = connect_from("127.0.0." + std::to_string(2 + i % 8), port);
      REQUIRE(fd >= 0);
      fds_.push_back(fd);
    }
    t_ = std::thread([this, every] {
      static const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
      for (std::size_t at = 0; !stop_; ++at) {
        for (int fd : fds_) ::send(fd, &head[std::min(at, head.size() - 1)], 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        for (auto slept = std::chrono::milliseconds(0); slept < every && !stop_; slept += std::chrono::milliseconds(20))
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  ~trickle() {
    stop_ = true;
    t_.join();
    for (int fd : fds_) ::close(fd);
  }
  // How many the server has closed (a read sees the end, or the 503 it answered first).
  int closed_by_server() const {
    int n = 0;
    for (int fd : fds_) {
      char buf[512];
      const auto got = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) ++n;
      if (got > 0 && ::recv(fd, buf, sizeof buf, MSG_DONTWAIT) == 0) ++n;
    }
    return n;
  }

 private:
  std::vector<int> fds_;
  std::atomic<bool> stop_ = false;
  std::thread t_;
};

int open_fds(pid_t pid) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) ++n;
  return n;
}

// A scrape's seconds, or -1 when it got no 200.
double scrape_seconds(std::uint16_t port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(10);
  c.set_read_timeout(10);
  const auto t0 = steady_clock::now();
  const auto r = c.Get("/metrics");
  return r && r->status == 200 ? seconds_since(t0) : -1;
}

}  // namespace

TEST_CASE("64 slow clients and a flood of 1000 connections stall neither /metrics nor the devices' listener") {
  workspace w("sec-http", 1, 512, 128);
  // A service's usual descriptor limit: the HTTP port may take an eighth of it.
  node server(w, "server", server_args(w, 1, 4, 1, {"--metrics", "0"}),
              {"/bin/sh", "-c", "ulimit -n 1024 && exec \"$0\" \"$@\"", CLEAVE_BINARY});
  const auto sp = server.port_after("listening on ");
  const auto mp = server.port_after("metrics on http://");
  const int fds_before = open_fds(server.pid());
  double worst = 0;
  {
    trickle slow(mp, 64, std::chrono::milliseconds(1000));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    for (int i = 0; i < 5; ++i) {
      const double s = scrape_seconds(mp);
      CHECK(s >= 0);
      worst = std::max(worst, s);
    }
    // A head not complete within 5 s is cut: every slow client is closed by then.
    std::this_thread::sleep_for(std::chrono::milliseconds(6500));
    CHECK(slow.closed_by_server() == 64);
  }
  MESSAGE("slowest of 5 scrapes with 64 slow clients: " << worst * 1e3 << " ms");
  CHECK(worst < 3.0);  // stalled, it would wait out the clients (minutes)
  {
    // 1000 idle connections from 200 addresses, held: the HTTP port keeps at most 1024 / 8.
    idle_flood flood(mp, 1000, [](int i) { return "127.0.1." + std::to_string(1 + i % 200); });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const int held = open_fds(server.pid()) - fds_before;
    MESSAGE("descriptors the server holds for 1000 flooding connections: " << held << " (of 1024)");
    CHECK(held <= 128 + 2);
    // A device joins and trains its round while the flood holds.
    node agent(w, "agent-1", agent_args(w, 1, sp));
    CHECK_MESSAGE(server.exit_code(120) == 0, server.log() << agent.log());
  }
}

TEST_CASE("an HTTP port beyond loopback needs a long token, or for metrics an explicit public flag") {
  const auto page = metrics::page{"/metrics", "text/plain", [] { return std::string("m 1\n"); }};
  CHECK_THROWS_WITH_AS(metrics::http_server("0.0.0.0:0", {page}, {"--metrics"}),
                       "--metrics 0.0.0.0:0: serving beyond loopback needs a token (--metrics-token)",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(metrics::http_server("0.0.0.0:0", {page}, {"--dashboard", "short"}),
                       "--dashboard-token: 5 characters; beyond loopback a token has at least 16",
                       std::invalid_argument);
  metrics::http_options pub{"--metrics"};
  pub.is_public = true;
  metrics::http_server open("0.0.0.0:0", {page}, pub);
  httplib::Client c("127.0.0.1", open.port());
  const auto r = c.Get("/metrics");
  REQUIRE(r);
  CHECK(r->status == 200);
  // On loopback a short token is the operator's business.
  CHECK_NOTHROW(metrics::http_server("0", {page}, {"--metrics", "abc"}));
}

TEST_CASE("with a token, every page but the health checks asks for it before anything is made") {
  const std::string token = "a-token-of-24-characters";
  int made = 0;
  const metrics::registry reg;
  metrics::exporter ex(reg, "0", {"--metrics", token});
  metrics::http_server s("0", {metrics::page{"/", "text/plain", [&made] { return std::to_string(++made); }}},
                         {"--dashboard", token});
  httplib::Client c("127.0.0.1", s.port());
  for (const char* path : {"/", "/?token=wrong", "/nothing"}) {
    const auto r = c.Get(path);
    REQUIRE(r);
    CHECK_MESSAGE(r->status == 401, path);
    CHECK(r->get_header_value("WWW-Authenticate") == "Bearer");
  }
  CHECK(made == 0);
  CHECK(c.Get("/?token=" + token)->status == 200);
  CHECK(c.Get("/", {{"Authorization", "Bearer " + token}})->body == "2");
  CHECK(c.Get("/nothing", {{"authorization", "bearer " + token}})->status == 404);
  httplib::Client m("127.0.0.1", ex.port());
  CHECK(m.Get("/metrics")->status == 401);
  CHECK(m.Get("/metrics", {{"Authorization", "Bearer " + token}})->status == 200);
  CHECK(m.Get("/healthz")->status == 200);
  CHECK(m.Get("/readyz")->status == 200);
}

TEST_CASE("an HTTP port answers GET and HEAD only, and a head over 16 KiB gets 431") {
  metrics::http_server s("0", {metrics::page{"/", "text/plain", [] { return std::string("hello"); }}});
  httplib::Client c("127.0.0.1", s.port());
  const auto post = c.Post("/", "x", "text/plain");
  REQUIRE(post);
  CHECK(post->status == 405);
  const auto head = c.Head("/");
  REQUIRE(head);
  CHECK(head->status == 200);
  CHECK(head->body.empty());
  const auto big = c.Get("/", {{"X-Big", std::string(20000, 'x')}});
  REQUIRE(big);
  CHECK(big->status == 431);
  // Beyond 8 connections from one address the next is turned away at once.
  std::vector<int> held;
  for (int i = 0; i < 8; ++i) held.push_back(connect_from("127.0.0.3", s.port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int ninth = connect_from("127.0.0.3", s.port());
  REQUIRE(ninth >= 0);
  std::string answer(256, '\0');
  timeval tv{5, 0};
  ::setsockopt(ninth, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const auto got = ::recv(ninth, answer.data(), answer.size(), 0);
  CHECK(answer.substr(0, std::max<ssize_t>(got, 0)).rfind("HTTP/1.1 503", 0) == 0);
  ::close(ninth);
  for (int fd : held) ::close(fd);
  // Another address is served meanwhile.
  CHECK(c.Get("/")->status == 200);
}
