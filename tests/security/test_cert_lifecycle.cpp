// The certificate lifecycle with the real `cleave` binary on loopback: renewal and revocation
// taken in on SIGHUP while training runs, bad files refused at reload, expiry warnings.
#include <doctest/doctest.h>

#include <fstream>

#include "cleave/transport/certs.h"
#include "nodes.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

// A federation that trains until it is stopped: rounds of a few steps, as many as it takes.
std::vector<std::string> long_server(const workspace& w) {
  return server_args(w, 100000, 3, 1, {"--deadline", "30"});
}

// Waits until `text` occurs at least `n` times in the node's log.
bool wait_for_count(const node& n, const std::string& text, int count, double seconds) {
  const auto until = steady_clock::now() + std::chrono::duration<double>(seconds);
  while (n.count(text) < count) {
    if (steady_clock::now() > until || !n.alive()) return n.count(text) >= count;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// Rounds the server finished so far.
int rounds_done(const node& server) {
  return server.count("/100000: ");
}

void hangup(const node& n) {
  REQUIRE(::kill(n.pid(), SIGHUP) == 0);
}

std::string cleave_cmd(const std::string& args) {
  return std::string(CLEAVE_BINARY) + " " + args + " > /dev/null 2>&1";
}

}  // namespace

TEST_CASE("revoking a device and a SIGHUP close its session and refuse its next handshake while the other trains on") {
  workspace w("life-revoke", 2, 512, 128);
  node server(w, "server", long_server(w));
  const auto sp = server.port_after("listening on ");
  // Device 2 behind the edge, device 1 straight to the server: both check the list.
  node edge(w, "edge",
            {"--log-level", "info", "edge", "--certs", w.certs.string(), "--name", "edge-1", "--id", "100", "--listen",
             "127.0.0.1:0", "--server", "127.0.0.1:" + std::to_string(sp), "--server-name", "server", "--backend",
             "reference"});
  const auto ep = edge.port_after("devices connect to ");
  node a1(w, "agent-1", agent_args(w, 1, sp));
  node a2(w, "agent-2", agent_args(w, 2, ep, {"--upstream-name", "edge-1"}));
  REQUIRE_MESSAGE(server.wait_for("2/2 devices", 60), server.log());

  REQUIRE(shell(cleave_cmd("certs revoke device-2 --reason key-compromise --dir " + w.certs.string())) == 0);
  hangup(server);
  hangup(edge);
  CHECK_MESSAGE(server.wait_for("server: reloaded for new connections: certificate 'server'", 20), server.log());
  CHECK_MESSAGE(edge.wait_for("reloaded for new connections: certificate 'edge-1'", 20), edge.log());
  CHECK_MESSAGE(edge.wait_for("closing the session of device-2", 20), edge.log());
  CHECK_MESSAGE(edge.wait_for("certificate 'device-2' rejected: certificate revoked", 20), edge.log());
  CHECK_MESSAGE(a2.wait_for("certificate revoked", 20), a2.log());
  // Device 1 trains on, alone, over the channel it had before the reload; the edge's link to the
  // server carried on too.
  const int seen = rounds_done(server);
  CHECK_MESSAGE(wait_for_count(server, "/100000: ", seen + 3, 60), server.log());
  CHECK(server.logged("1/1 devices"));
  CHECK(server.count("accepted device-1") == 1);
  CHECK(server.count("accepted edge-1") == 1);
  CHECK(server.alive());
  CHECK(edge.alive());
  // Five refusals in a row: the revoked device gives up with the reason.
  CHECK(a2.exit_code(30) == 1);
  CHECK_MESSAGE(a2.logged("times in a row"), a2.log());
  ::kill(server.pid(), SIGTERM);
  CHECK_MESSAGE(server.exit_code(60) == 0, server.log());
  CHECK(a1.exit_code(30) == 0);
}

TEST_CASE("a device revoked at the server is dropped by its edge within 10 s, with no reload or new files there") {
  workspace w("life-revoke-push", 2, 512, 128);
  // The edge's own copy of its files, as on a separate machine: nobody writes a list there.
  const fs::path edge_certs = w.dir / "edge-certs";
  fs::create_directories(edge_certs);
  for (const char* f : {"ca.crt", "edge-1.crt", "edge-1.key"}) fs::copy_file(w.certs / f, edge_certs / f);
  fs::permissions(edge_certs / "edge-1.key", fs::perms::owner_read | fs::perms::owner_write);
  node server(w, "server", long_server(w));
  const auto sp = server.port_after("listening on ");
  node edge(w, "edge",
            {"--log-level", "info", "edge", "--certs", edge_certs.string(), "--name", "edge-1", "--id", "100",
             "--listen", "127.0.0.1:0", "--server", "127.0.0.1:" + std::to_string(sp), "--server-name", "server",
             "--backend", "reference"});
  const auto ep = edge.port_after("devices connect to ");
  node a1(w, "agent-1", agent_args(w, 1, sp));
  node a2(w, "agent-2", agent_args(w, 2, ep, {"--upstream-name", "edge-1"}));
  REQUIRE_MESSAGE(server.wait_for("2/2 devices", 60), server.log());

  REQUIRE(shell(cleave_cmd("certs revoke device-2 --reason key-compromise --dir " + w.certs.string())) == 0);
  hangup(server);  // the server only
  REQUIRE_MESSAGE(server.wait_for("server: reloaded for new connections: certificate 'server'", 20), server.log());
  const auto reloaded = steady_clock::now();
  CHECK_MESSAGE(edge.wait_for("closing the session of device-2", 10), edge.log());
  const double took = std::chrono::duration<double>(steady_clock::now() - reloaded).count();
  MESSAGE("the edge dropped the revoked device " << took << " s after the server's reload");
  CHECK(took < 10);
  CHECK_MESSAGE(edge.logged("revocation list from upstream in force"), edge.log());
  CHECK_FALSE(edge.logged("reloaded for new connections"));
  CHECK_MESSAGE(edge.wait_for("certificate 'device-2' rejected: certificate revoked", 20), edge.log());
  // The edge kept the list for a restart, and device 1 (straight to the server) has it too.
  CHECK(transport::read_revocations(edge_certs).size() == 1);
  CHECK_MESSAGE(a1.wait_for("revocation list from upstream in force", 10), a1.log());
  const int seen = rounds_done(server);
  CHECK_MESSAGE(wait_for_count(server, "/100000: ", seen + 2, 60), server.log());
  CHECK(server.count("accepted edge-1") == 1);
  CHECK(a2.exit_code(30) == 1);
  ::kill(server.pid(), SIGTERM);
  CHECK_MESSAGE(server.exit_code(60) == 0, server.log());
  CHECK(a1.exit_code(30) == 0);
}

TEST_CASE("a device renewed with its old certificate revoked reconnects with the new one after SIGHUP") {
  workspace w("life-renew", 1, 512, 128);
  node server(w, "server", long_server(w));
  const auto sp = server.port_after("listening on ");
  node a1(w, "agent-1", agent_args(w, 1, sp));
  REQUIRE_MESSAGE(server.wait_for("server: device 1 joined", 60), server.log());
  // The old pair, kept to try it after the revocation.
  const fs::path old = w.dir / "old";
  fs::create_directories(old);
  for (const char* f : {"ca.crt", "device-1.crt", "device-1.key"}) fs::copy_file(w.certs / f, old / f);
  const auto before = transport::read_certificate_info(w.certs / "device-1.crt");

  REQUIRE(shell(cleave_cmd("certs renew device-1 --revoke-old --dir " + w.certs.string())) == 0);
  const auto after = transport::read_certificate_info(w.certs / "device-1.crt");
  REQUIRE(after.serial != before.serial);
  hangup(a1);
  CHECK_MESSAGE(a1.wait_for("reloaded for new connections: certificate 'device-1' (serial " + after.serial, 20),
                a1.log());
  // The agent's channel carries on with the old certificate until the server takes the list in.
  const int seen = rounds_done(server);
  CHECK(wait_for_count(server, "/100000: ", seen + 2, 60));
  CHECK(server.count("accepted device-1") == 1);
  hangup(server);
  CHECK_MESSAGE(server.wait_for("closing the session of device-1", 20), server.log());
  CHECK_MESSAGE(wait_for_count(server, "accepted device-1", 2, 30), server.log());
  const int rejoined = rounds_done(server);
  CHECK_MESSAGE(wait_for_count(server, "/100000: ", rejoined + 2, 60), server.log());

  // The old certificate is refused at its handshake.
  client_thread client;
  const transport::tls_context old_tls(transport::tls_files_in(old, "device-1"));
  const auto refused = client.run(hello_as(old_tls, sp, 1));
  CHECK_FALSE(refused);
  CHECK_MESSAGE(server.wait_for("certificate 'device-1' rejected: certificate revoked", 20), server.log());
  ::kill(server.pid(), SIGTERM);
  CHECK_MESSAGE(server.exit_code(60) == 0, server.log());
  CHECK(a1.exit_code(30) == 0);
}

TEST_CASE("a corrupt revocation list or certificate at SIGHUP is refused with the reason and the node serves on") {
  workspace w("life-corrupt", 2, 512, 128);
  node server(w, "server", long_server(w));
  const auto sp = server.port_after("listening on ");
  node a1(w, "agent-1", agent_args(w, 1, sp));
  REQUIRE_MESSAGE(server.wait_for("server: device 1 joined", 60), server.log());

  std::ofstream(w.certs / "ca.crl") << "-----BEGIN X509 CRL-----\nnot base64 at all\n-----END X509 CRL-----\n";
  hangup(server);
  CHECK_MESSAGE(server.wait_for("reload refused, the certificates in use stay: revocation list " +
                                    (w.certs / "ca.crl").string() + " is not a PEM certificate revocation list",
                                20),
                server.log());
  fs::remove(w.certs / "ca.crl");
  const std::string good = read_file(w.certs / "server.crt");
  std::ofstream(w.certs / "server.crt", std::ios::trunc) << good.substr(0, good.size() / 2);
  hangup(server);
  CHECK_MESSAGE(server.wait_for("certificate " + (w.certs / "server.crt").string() + " is not a PEM certificate", 20),
                server.log());
  CHECK(server.alive());
  // New connections still get the certificates in force.
  node a2(w, "agent-2", agent_args(w, 2, sp));
  CHECK_MESSAGE(server.wait_for("server: device 2 joined", 60), server.log());
  std::ofstream(w.certs / "server.crt", std::ios::trunc) << good;
  hangup(server);
  CHECK_MESSAGE(server.wait_for("server: reloaded for new connections", 20), server.log());
  const int seen = rounds_done(server);
  CHECK(wait_for_count(server, "/100000: ", seen + 2, 60));
  CHECK(server.count("accepted device-1") == 1);
  ::kill(server.pid(), SIGTERM);
  CHECK_MESSAGE(server.exit_code(60) == 0, server.log());
}

TEST_CASE("a node warns when its own certificate or a peer's expires within 30 days, at start, reload and handshake") {
  workspace w("life-expiry", 1, 512, 128);
  for (const char* name : {"server", "device-1"}) {
    transport::renew_options ro;
    ro.valid_days = 12;
    transport::renew_certificate(w.certs, name, ro);
  }
  node server(w, "server", long_server(w));
  const auto sp = server.port_after("listening on ");
  CHECK_MESSAGE(
      server.logged("certificate 'server' of this node (" + (w.certs / "server.crt").string() + ") expires in 11 days"),
      server.log());
  node a1(w, "agent-1", agent_args(w, 1, sp));
  CHECK_MESSAGE(server.wait_for("certificate 'device-1' of peer 127.0.0.1:", 30), server.log());
  CHECK(server.logged("expires in 11 days, on "));
  CHECK_MESSAGE(a1.wait_for("certificate 'server' of peer 127.0.0.1:" + std::to_string(sp) + " expires in 11 days", 30),
                a1.log());
  CHECK(a1.count("certificate 'device-1' of this node") == 1);
  hangup(a1);
  CHECK_MESSAGE(wait_for_count(a1, "certificate 'device-1' of this node", 2, 20), a1.log());
  CHECK(server.count("certificate 'device-1' of peer") == 1);
  CHECK(wait_for_count(server, "/100000: ", 1, 60));
  ::kill(server.pid(), SIGTERM);
  CHECK_MESSAGE(server.exit_code(60) == 0, server.log());
  CHECK(a1.exit_code(30) == 0);
}
