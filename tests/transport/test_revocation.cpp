// The certificate lifecycle in the transport: revocation lists written by the CA, renewal, a
// listener that refuses revoked peers at the handshake after a reload, reloads that refuse bad
// files and keep the state in force, and warnings about certificates close to expiry.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "channel_pair.h"
#include "cleave/core/error.h"
#include "cleave/protocol/protocol.h"
#include "cleave/transport/certs.h"
#include "cleave/transport/connect.h"
#include "cleave/transport/listener.h"
#include "cleave/transport/tls_context.h"
#include "test_support.h"

using namespace cleave;
using namespace cleave::transport;
using namespace cleave::transport::testing;
namespace fs = std::filesystem;

namespace {

// A federation of its own for each test (they change its files): CA, server, device-1, device-2.
struct federation {
  fs::path dir = make_temp_dir("revoke");
  explicit federation(int device_days = 365) {
    init_ca(dir);
    issue_options s;
    s.role = core::tier::server;
    issue_certificate(dir, "server", s);
    issue_options d;
    d.role = core::tier::device;
    d.valid_days = device_days;
    issue_certificate(dir, "device-1", d);
    issue_certificate(dir, "device-2", d);
  }
  ~federation() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  federation(const federation&) = delete;
  federation& operator=(const federation&) = delete;
  fs::path crt(const std::string& name) const { return dir / (name + ".crt"); }
  tls_files files(const std::string& name) const { return tls_files_in(dir, name); }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const core::error& e) {
    return e.what();
  }
  FAIL("no error thrown");
  return {};
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 0777;
}

int count_logged(const std::string& a, const std::string& b = {}) {
  int n = 0;
  for (const auto& line : log_capture()->last_formatted())
    if (line.find(a) != std::string::npos && line.find(b) != std::string::npos) ++n;
  return n;
}

// A message the channel hands to receive() (heartbeats it keeps to itself).
message_builder hello() {
  protocol::hello_info h;
  h.role = core::tier::device;
  h.node_id = 1;
  return protocol::make_hello(h);
}

// Connects as `ctx`, then sends and receives one message on the channel (a refused client
// certificate shows on the first read with TLS 1.3): "" when the link works, else why not.
asio::awaitable<std::string> try_link(listener& lis, tls_context ctx) {
  connect_options co;
  co.timeout = std::chrono::seconds(10);
  auto connecting = connect(ctx, "127.0.0.1", lis.port(), co);
  auto server_side = lis.accept();
  auto ch = co_await std::move(connecting);
  if (!ch) co_return ch.error().reason();
  auto peer = co_await std::move(server_side);
  if (!peer) co_return "accept failed: " + peer.error().reason();
  co_await ch->send(hello());
  auto m = co_await peer->receive();
  co_return m ? std::string() : "no message: " + m.error().reason();
}

}  // namespace

TEST_CASE("revoking writes a list the CA signed, revoking again changes nothing, a stranger's certificate is refused") {
  federation f;
  const auto info = read_certificate_info(f.crt("device-2"));
  const auto r = revoke_certificate(f.dir, f.crt("device-2"), revocation_reason::key_compromise);
  CHECK(r.name == "device-2");
  CHECK(r.serial == info.serial);
  CHECK_FALSE(r.already);
  CHECK(r.n_revoked == 1);
  CHECK(r.crl == f.dir / "ca.crl");
  CHECK(mode_of(r.crl) == 0644);
  CHECK_FALSE(fs::exists(f.dir / "ca.crl.tmp"));
  auto entries = read_revocations(f.dir);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].serial == info.serial);
  CHECK(entries[0].reason == revocation_reason::key_compromise);

  const std::string before = read(r.crl);
  const auto again = revoke_certificate(f.dir, f.crt("device-2"));
  CHECK(again.already);
  CHECK(again.n_revoked == 1);
  CHECK(read(r.crl) == before);

  CHECK(revoke_certificate(f.dir, f.crt("device-1")).n_revoked == 2);
  entries = read_revocations(f.dir);
  REQUIRE(entries.size() == 2);

  federation other;
  CHECK(error_of([&] { revoke_certificate(f.dir, other.crt("device-1")); }).find("was not issued by the CA in") !=
        std::string::npos);
  // A list that is not this CA's is never extended.
  fs::copy_file(f.dir / "ca.crl", other.dir / "ca.crl");
  CHECK(error_of([&] { revoke_certificate(other.dir, other.crt("device-1")); }).find("is not the CA's") !=
        std::string::npos);
  write(f.dir / "ca.crl", "not a list\n");
  CHECK(error_of([&] { read_revocations(f.dir); }).find("is not a PEM certificate revocation list") !=
        std::string::npos);
  CHECK(revocation_reason_from_name("superseded") == revocation_reason::superseded);
  CHECK_FALSE(revocation_reason_from_name("lost"));
}

TEST_CASE("renewing gives a new key and serial with the same name, role, bound id, alt names and lifetime") {
  federation f;
  issue_options o;
  o.role = core::tier::device;
  o.node_id = 42;
  o.valid_days = 90;
  o.dns_names = {"board.local"};
  o.ip_addresses = {"10.0.0.7"};
  issue_certificate(f.dir, "sensor", o);
  const auto before = read_certificate_info(f.crt("sensor"));
  const std::string old_key = read(f.dir / "sensor.key");
  const auto r = renew_certificate(f.dir, "sensor");
  CHECK(r.previous.serial == before.serial);
  CHECK(r.current.serial != before.serial);
  CHECK(r.current.name == "sensor");
  CHECK(r.current.role == core::tier::device);
  CHECK(r.current.node_id == 42u);
  CHECK(read(f.dir / "sensor.key") != old_key);
  CHECK(mode_of(f.dir / "sensor.key") == 0600);
  CHECK(std::chrono::duration_cast<std::chrono::hours>(r.current.not_after - r.current.not_before).count() / 24 == 90);
  CHECK_FALSE(r.revoked);
  CHECK_NOTHROW(check_node_files(f.dir / "ca.crt", f.crt("sensor"), f.dir / "sensor.key"));
  // The alt names came along (openssl prints them).
  FILE* p = ::popen(("openssl x509 -noout -ext subjectAltName -in " + f.crt("sensor").string()).c_str(), "r");
  REQUIRE(p != nullptr);
  std::string text;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) text += buf;
  ::pclose(p);
  CHECK_MESSAGE(text.find("DNS:sensor, DNS:board.local, IP Address:10.0.0.7") != std::string::npos, text);

  renew_options ro;
  ro.valid_days = 10;
  ro.revoke_previous = true;
  const auto again = renew_certificate(f.dir, "sensor", ro);
  REQUIRE(again.revoked);
  CHECK(again.revoked->serial == r.current.serial);
  const auto entries = read_revocations(f.dir);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].reason == revocation_reason::superseded);
  CHECK(std::chrono::duration_cast<std::chrono::hours>(again.current.not_after - again.current.not_before).count() /
            24 ==
        10);
  CHECK(error_of([&] { renew_certificate(f.dir, "nobody"); }).find("no certificate of 'nobody'") != std::string::npos);
}

TEST_CASE(
    "after a reload the listener refuses a revoked device at the handshake naming it, and open channels carry on") {
  federation f;
  io_thread rt;
  tls_context server(f.files("server"));
  listener lis(rt.executor(), server, loopback());
  const tls_context d1(f.files("device-1")), d2(f.files("device-2"));
  CHECK(rt.run(try_link(lis, d2)).empty());
  // A channel of device-1 opened before the reload.
  auto p = rt.run(open_pair(lis, d1));

  revoke_certificate(f.dir, f.crt("device-2"));
  CHECK(rt.run(try_link(lis, d2)).empty());  // not reloaded yet: the list is not in force
  const std::string loaded = server.reload();
  CHECK_MESSAGE(loaded.find("revocation list " + (f.dir / "ca.crl").string() + " (1 entry") != std::string::npos,
                loaded);
  CHECK(server.revokes(read_certificate_info(f.crt("device-2")).serial));
  const std::string why = rt.run(try_link(lis, d2));
  CHECK_MESSAGE(why.find("certificate revoked") != std::string::npos, why);
  CHECK(eventually([] {
    return logged("refused connection from 127.0.0.1", "certificate 'device-2' rejected: certificate revoked");
  }));
  CHECK(rt.run(try_link(lis, d1)).empty());
  // The channel opened before the reload still carries messages both ways.
  CHECK(rt.run([&]() -> asio::awaitable<bool> {
    co_await p.client.send(hello());
    auto a = co_await p.server.receive();
    co_await p.server.send(hello());
    auto b = co_await p.client.receive();
    co_return a.ok() && b.ok();
  }()));
}

TEST_CASE("a reload with a bad or foreign file is refused with the reason and the state in force stays") {
  federation f;
  io_thread rt;
  revoke_certificate(f.dir, f.crt("device-2"));
  tls_context server(f.files("server"));
  listener lis(rt.executor(), server, loopback());
  const tls_context d1(f.files("device-1")), d2(f.files("device-2"));
  const auto crl = f.dir / "ca.crl", crt = f.crt("server"), key = f.dir / "server.key";
  const std::string good_crl = read(crl), good_crt = read(crt), good_key = read(key);
  federation other;
  issue_options s;
  s.role = core::tier::server;
  issue_certificate(f.dir, "backup-server", s);

  struct bad_case {
    const char* what;
    std::function<void()> spoil;
    const char* says;
  };
  const std::vector<bad_case> cases = {
      {"a corrupt list", [&] { write(crl, "-----BEGIN X509 CRL-----\ngarbage\n-----END X509 CRL-----\n"); },
       "is not a PEM certificate revocation list"},
      {"another CA's list",
       [&] {
         revoke_certificate(other.dir, other.crt("device-1"));
         fs::copy_file(other.dir / "ca.crl", crl, fs::copy_options::overwrite_existing);
       },
       "is not the CA's"},
      {"the list removed", [&] { fs::remove(crl); }, "is gone; a reload does not drop the revocations in force"},
      {"a corrupt certificate", [&] { write(crt, "garbage"); }, "is not a PEM certificate"},
      {"a key of another certificate",
       [&] { fs::copy_file(f.dir / "backup-server.key", key, fs::copy_options::overwrite_existing); },
       "does not match certificate"},
      {"the certificate of another node",
       [&] {
         fs::copy_file(f.crt("backup-server"), crt, fs::copy_options::overwrite_existing);
         fs::copy_file(f.dir / "backup-server.key", key, fs::copy_options::overwrite_existing);
       },
       "is for 'backup-server' (server), not for this node 'server' (server)"},
      {"a certificate of another CA",
       [&] {
         fs::copy_file(other.crt("device-1"), crt, fs::copy_options::overwrite_existing);
         fs::copy_file(other.dir / "device-1.key", key, fs::copy_options::overwrite_existing);
       },
       "does not verify against CA"},
  };
  for (const auto& c : cases) {
    CAPTURE(std::string(c.what));
    c.spoil();
    const std::string why = error_of([&] { server.reload(); });
    CHECK_MESSAGE(why.find(c.says) != std::string::npos, why);
    // The state in force serves on: device-1 joins, device-2 stays refused.
    CHECK(rt.run(try_link(lis, d1)).empty());
    CHECK(rt.run(try_link(lis, d2)).find("certificate revoked") != std::string::npos);
    write(crl, good_crl);
    write(crt, good_crt);
    write(key, good_key);
    fs::permissions(key, fs::perms::owner_read | fs::perms::owner_write);
  }
  CHECK(server.reload().find("certificate 'server'") != std::string::npos);
}

TEST_CASE("certificates expiring within 30 days are warned about: this node's at load and reload, a peer's once") {
  federation f(10);
  io_thread rt;
  tls_context server(f.files("server"));
  listener lis(rt.executor(), server, loopback());
  CHECK_FALSE(logged("certificate 'server' of this node"));
  const int own_before = count_logged("certificate 'device-1' of this node");
  const tls_context d1(f.files("device-1"));
  CHECK(count_logged("certificate 'device-1' of this node", "expires in 9 days") == own_before + 1);
  tls_context reloaded(f.files("device-1"));
  const int own = count_logged("certificate 'device-1' of this node");
  reloaded.reload();
  CHECK(count_logged("certificate 'device-1' of this node", "renew it (`cleave certs renew device-1`)") == own + 1);

  const int peer_before = count_logged("certificate 'device-1' of peer 127.0.0.1:");
  for (int i = 0; i < 3; ++i) CHECK(rt.run(try_link(lis, d1)).empty());
  CHECK(count_logged("certificate 'device-1' of peer 127.0.0.1:", "expires in 9 days") == peer_before + 1);
  // A renewed certificate is a new one: warned about again only if it expires soon too.
  renew_certificate(f.dir, "device-1");
  const tls_context d1_new(f.files("device-1"));
  CHECK(rt.run(try_link(lis, d1_new)).empty());
  CHECK(count_logged("certificate 'device-1' of peer 127.0.0.1:") == peer_before + 2);
  renew_options longer;
  longer.valid_days = 365;
  renew_certificate(f.dir, "device-1", longer);
  const tls_context d1_long(f.files("device-1"));
  CHECK(rt.run(try_link(lis, d1_long)).empty());
  CHECK(count_logged("certificate 'device-1' of peer 127.0.0.1:") == peer_before + 2);
}

TEST_CASE("a revocation list from upstream is put in force when the CA's and newer, saved, and kept over older files") {
  federation f;
  // The node's own directory, whose list stays as it was: a board that nobody touches.
  const fs::path node = make_temp_dir("revoke-node");
  for (const char* file : {"ca.crt", "device-1.crt", "device-1.key"}) fs::copy_file(f.dir / file, node / file);
  tls_context ctx(tls_files_in(node, "device-1"));
  CHECK(ctx.revocation_list().empty());
  const auto serial2 = read_certificate_info(f.crt("device-2")).serial;
  const auto serial1 = read_certificate_info(f.crt("device-1")).serial;

  revoke_certificate(f.dir, f.crt("device-2"));
  const auto first = tls_context(f.files("server")).revocation_list();
  REQUIRE_FALSE(first.empty());
  const auto now = ctx.adopt_revocation_list(first);
  REQUIRE(now);
  CHECK_MESSAGE(now->find("received from upstream (1 entry") != std::string::npos, *now);
  CHECK(ctx.revokes(serial2));
  CHECK(ctx.revocation_list() == first);
  // Saved over the node's list file, for a restart before its upstream is back.
  REQUIRE(fs::exists(node / "ca.crl"));
  CHECK(read_revocations(node).size() == 1);
  CHECK_FALSE(ctx.adopt_revocation_list(first));  // the list in force

  const std::string older_pem = read(f.dir / "ca.crl");
  revoke_certificate(f.dir, f.crt("device-1"), revocation_reason::superseded);
  const auto second = tls_context(f.files("server")).revocation_list();
  REQUIRE(ctx.adopt_revocation_list(second));
  CHECK(ctx.revokes(serial1));
  CHECK_FALSE(ctx.adopt_revocation_list(first));  // older: ignored
  CHECK(ctx.revokes(serial1));
  // An older list written back to the node's file and reloaded does not undo the newer one.
  write(node / "ca.crl", older_pem);
  const std::string reloaded = ctx.reload();
  CHECK_MESSAGE(reloaded.find("received from upstream (2 entries") != std::string::npos, reloaded);
  CHECK(ctx.revokes(serial1));

  // Lists that are not this CA's, or not lists, are refused naming why; the list in force stays.
  federation other;
  revoke_certificate(other.dir, other.crt("device-2"));
  revoke_certificate(other.dir, other.crt("device-1"));
  revoke_certificate(other.dir, other.crt("server"));
  const auto forged = tls_context(other.files("device-1")).revocation_list();
  CHECK(error_of([&] { ctx.adopt_revocation_list(forged); }).find("is not the CA's") != std::string::npos);
  std::vector<std::uint8_t> garbage(300, 0x30);
  CHECK(error_of([&] { ctx.adopt_revocation_list(garbage); }).find("does not parse") != std::string::npos);
  auto cut = second;
  cut.resize(cut.size() / 2);
  CHECK(error_of([&] { ctx.adopt_revocation_list(cut); }).find("does not parse") != std::string::npos);
  CHECK(ctx.revocation_list() == second);
  std::error_code ec;
  fs::remove_all(node, ec);
}
