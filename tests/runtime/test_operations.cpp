// Operating the nodes as processes: `cleave --version`, the build in the metrics, the health and
// readiness endpoints, and SIGTERM in every phase (waiting, connecting, training, already
// stopping) ending a node with status 0.
#include <doctest/doctest.h>
#include <httplib.h>
#include <signal.h>

#include <asio/ip/tcp.hpp>
#include <atomic>
#include <string>
#include <thread>

#include "../security/nodes.h"
#include "../support/run_cleave.h"

namespace cleave::testing {
namespace {

struct answer {
  int status = 0;  // 0: no answer
  std::string body;
};

answer get(std::uint16_t port, const std::string& path) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(2, 0);
  c.set_read_timeout(5, 0);
  auto r = c.Get(path);
  if (!r) return {};
  return {r->status, r->body};
}

// A loopback port nothing listens on (bound, then closed).
std::uint16_t closed_port() {
  asio::io_context io;
  asio::ip::tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

// Sends SIGTERM to pid every 2 ms until it has exited (or 60 s went by); its exit status, -1
// when a signal ended it.
int terminate_repeatedly(node& n) {
  std::atomic<bool> done{false};
  std::thread spam([&] {
    while (!done) {
      ::kill(n.pid(), SIGTERM);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  const int code = n.exit_code(60);
  done = true;
  spam.join();
  return code;
}

}  // namespace

TEST_CASE("cleave --version names the version, the commit, the build type and the backends compiled in") {
  const auto r = run_cleave({"--version"});
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(r.output.rfind("cleave 0.", 0) == 0);
  CHECK(r.output.find(" (commit ") != std::string::npos);
  CHECK(r.output.find(" build; backends: ") != std::string::npos);
  CHECK(r.output.find("reference") != std::string::npos);
}

TEST_CASE("nodes serve /healthz, /readyz and cleave_build_info, and SIGTERM while waiting or connecting exits 0") {
  workspace w("ops-health", 1);
  // An agent whose server is not there: alive, not ready.
  node agent(w, "agent", agent_args(w, 1, closed_port(), {"--metrics", "127.0.0.1:0"}));
  const auto agent_port = agent.port_after("metrics on http://");
  CHECK(get(agent_port, "/healthz").status == 200);
  const auto not_ready = get(agent_port, "/readyz");
  CHECK(not_ready.status == 503);
  CHECK(not_ready.body == "not connected to its upstream\n");
  const std::string metrics = get(agent_port, "/metrics").body;
  CHECK(metrics.find("cleave_build_info{version=\"0.") != std::string::npos);
  CHECK(metrics.find(",build_type=\"") != std::string::npos);
  CHECK(get(agent_port, "/nothing").status == 404);

  // A server waiting for two devices that never come is ready (listening).
  node server(w, "server", server_args(w, 1, 5, 2, {"--metrics", "127.0.0.1:0"}));
  const auto server_port = server.port_after("metrics on http://");
  REQUIRE_MESSAGE(server.wait_for("waiting for 2 devices", 60), server.log());
  const auto ready = get(server_port, "/readyz");
  CHECK(ready.status == 200);
  CHECK(ready.body == "ready\n");

  ::kill(server.pid(), SIGTERM);
  CHECK_MESSAGE(server.exit_code(60) == 0, server.log());
  CHECK(server.logged("server: terminated (SIGTERM)"));
  ::kill(agent.pid(), SIGTERM);
  CHECK_MESSAGE(agent.exit_code(60) == 0, agent.log());
}

TEST_CASE("a node sent SIGTERM again and again while it stops exits 0, not killed by the signal") {
  workspace w("ops-sigterm", 2);
  for (int attempt = 0; attempt < 3; ++attempt) {
    CAPTURE(attempt);
    node server(w, "server-" + std::to_string(attempt), server_args(w, 50, 20, 2));
    const auto port = server.port_after("listening on ");
    node a1(w, "agent-1-" + std::to_string(attempt), agent_args(w, 1, port));
    node a2(w, "agent-2-" + std::to_string(attempt), agent_args(w, 2, port));
    REQUIRE_MESSAGE(server.wait_for("round 1/50", 120), server.log());
    // One agent stops while training; then the server, while the other is still connected.
    CHECK_MESSAGE(terminate_repeatedly(a1) == 0, a1.log());
    CHECK(a1.signal_number() == 0);
    CHECK_MESSAGE(terminate_repeatedly(server) == 0, server.log());
    CHECK(server.signal_number() == 0);
    // The other agent sees its server gone; stopped now, while it reconnects.
    CHECK_MESSAGE(terminate_repeatedly(a2) == 0, a2.log());
    CHECK(a2.signal_number() == 0);
  }
}

}  // namespace cleave::testing
