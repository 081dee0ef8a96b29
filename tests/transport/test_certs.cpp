// Provisioning: the federation CA, node certificates (names, roles, usages, validity), key file
// modes, and clear errors for missing or mismatched files.
#include <doctest/doctest.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>

#include "cleave/core/error.h"
#include "cleave/transport/certs.h"
#include "cleave/transport/tls_context.h"

using namespace cleave;
using namespace cleave::transport;
namespace fs = std::filesystem;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string templ = (fs::temp_directory_path() / "cleave-certs-XXXXXX").string();
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path = templ;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 0777;
}

struct x509_free_t {
  void operator()(X509* x) const { X509_free(x); }
};
std::unique_ptr<X509, x509_free_t> load(const fs::path& p) {
  FILE* f = std::fopen(p.c_str(), "r");
  REQUIRE(f != nullptr);
  X509* x = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  REQUIRE(x != nullptr);
  return std::unique_ptr<X509, x509_free_t>(x);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const core::error& e) {
    return e.what();
  }
  FAIL("no error thrown");
  return {};
}

bool has_san(X509* x, const std::string& dns) {
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(x, NID_subject_alt_name, nullptr, nullptr));
  bool found = false;
  for (int i = 0; names && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
    if (n->type == GEN_DNS) {
      const auto* s = reinterpret_cast<const char*>(ASN1_STRING_get0_data(n->d.dNSName));
      if (dns == std::string(s, static_cast<std::size_t>(ASN1_STRING_length(n->d.dNSName)))) found = true;
    }
  }
  GENERAL_NAMES_free(names);
  return found;
}

}  // namespace

TEST_CASE("init_ca writes a CA certificate and a key readable only by its owner") {
  temp_dir d;
  const auto files = init_ca(d.path / "fed");
  CHECK(files.cert == d.path / "fed" / "ca.crt");
  CHECK(mode_of(files.key) == 0600);
  const auto info = read_certificate_info(files.cert);
  CHECK(info.is_ca);
  CHECK(info.name == "cleave federation CA");
  CHECK(info.not_after - info.not_before > std::chrono::hours(24 * 3000));
  const auto x = load(files.cert);
  CHECK(X509_check_ca(x.get()) > 0);
  CHECK((X509_get_key_usage(x.get()) & KU_KEY_CERT_SIGN) != 0);
}

TEST_CASE("init_ca refuses to replace an existing CA unless asked") {
  temp_dir d;
  init_ca(d.path);
  CHECK(error_of([&] { init_ca(d.path); }).find("already exists") != std::string::npos);
  ca_options force;
  force.overwrite = true;
  CHECK_NOTHROW(init_ca(d.path, force));
}

TEST_CASE("issued certificates carry the name, role and usages of their node") {
  temp_dir d;
  init_ca(d.path);
  struct role_case {
    const char* name;
    core::tier role;
    bool server_auth;
  };
  for (const auto& c : {role_case{"gpu-0", core::tier::server, true}, role_case{"edge.rack-1", core::tier::edge, true},
                        role_case{"phone_17", core::tier::device, false}}) {
    CAPTURE(c.name);
    issue_options o;
    o.role = c.role;
    o.dns_names = {"extra.example"};
    const auto files = issue_certificate(d.path, c.name, o);
    CHECK(files.cert == d.path / (std::string(c.name) + ".crt"));
    CHECK(mode_of(files.key) == 0600);
    const auto info = read_certificate_info(files.cert);
    CHECK(info.name == c.name);
    CHECK(info.role == c.role);
    CHECK(info.issuer == "cleave federation CA");
    CHECK_FALSE(info.is_ca);
    const auto x = load(files.cert);
    const auto eku = X509_get_extended_key_usage(x.get());
    CHECK(((eku & XKU_SSL_CLIENT) != 0));
    CHECK(((eku & XKU_SSL_SERVER) != 0) == c.server_auth);
    CHECK((X509_get_key_usage(x.get()) & KU_DIGITAL_SIGNATURE) != 0);
    CHECK(X509_check_purpose(x.get(), X509_PURPOSE_SSL_CLIENT, 0) == 1);
    CHECK((X509_check_purpose(x.get(), X509_PURPOSE_SSL_SERVER, 0) == 1) == c.server_auth);
    CHECK(has_san(x.get(), "extra.example"));
    // Names with '_' are not DNS names: only the subject carries them.
    CHECK(has_san(x.get(), c.name) == (std::string(c.name).find('_') == std::string::npos));
    CHECK_NOTHROW(check_node_files(d.path / "ca.crt", files.cert, files.key));
    const tls_context ctx(tls_files_in(d.path, c.name));
    CHECK(ctx.identity() == c.name);
    CHECK(ctx.role() == c.role);
  }
}

TEST_CASE("a certificate binds a node id: issued into it, or the N of a name ending in -N") {
  CHECK(node_id_of("device-12", "") == 12u);
  CHECK(node_id_of("rack-3.device-7", "") == 7u);
  CHECK(node_id_of("device-12", "40") == 40u);  // the issued id wins over the name
  for (const char* none : {"sensor", "device-", "device-0", "device-007", "device-1000000", "device-1x", "-5"}) {
    CAPTURE(none);
    CHECK_FALSE(node_id_of(none, "").has_value());
  }
  temp_dir d;
  init_ca(d.path);
  issue_options o;
  o.node_id = 42;
  issue_certificate(d.path, "sensor", o);
  CHECK(read_certificate_info(d.path / "sensor.crt").node_id == 42u);
  CHECK(tls_context(tls_files_in(d.path, "sensor")).node_id() == 42u);
  issue_certificate(d.path, "device-5", issue_options{});
  CHECK(read_certificate_info(d.path / "device-5.crt").node_id == 5u);
  issue_certificate(d.path, "phone", issue_options{});
  CHECK_FALSE(read_certificate_info(d.path / "phone.crt").node_id.has_value());
  o.node_id = 0;
  CHECK(error_of([&] { issue_certificate(d.path, "bad-id", o); }) == "node id 0 out of range (1 to 999999)");
}

TEST_CASE("an id already bound to another node of the role is refused until that certificate is revoked") {
  temp_dir d;
  init_ca(d.path);
  issue_certificate(d.path, "device-3", issue_options{});
  issue_options o;
  o.node_id = 3;
  CHECK(error_of([&] { issue_certificate(d.path, "sensor", o); }) ==
        "device id 3 is already bound to 'device-3' (" + (d.path / "device-3.crt").string() +
            "): revoke that certificate first (cleave certs revoke) or choose another id");
  CHECK_FALSE(fs::exists(d.path / "sensor.crt"));
  // Into another directory too, and by a name ending in -3.
  temp_dir kits;
  CHECK(error_of([&] {
          issue_certificate(d.path, "rack-1.device-3", issue_options{}, kits.path);
        }).find("device id 3 is already bound to 'device-3'") == 0);
  // Another role's id 3 is its own; the same name again (a renewal) is not another holder.
  issue_options edge;
  edge.role = core::tier::edge;
  CHECK_NOTHROW(issue_certificate(d.path, "edge-3", edge));
  o.overwrite = true;
  CHECK_NOTHROW(issue_certificate(d.path, "device-3", o));
  // Once revoked, the id is free again.
  revoke_certificate(d.path, d.path / "device-3.crt", revocation_reason::key_compromise);
  o.overwrite = false;
  CHECK_NOTHROW(issue_certificate(d.path, "sensor", o));
  CHECK(read_certificate_info(d.path / "sensor.crt").node_id == 3u);
}

TEST_CASE("a certificate can be issued into another directory with an explicit validity window") {
  temp_dir d;
  init_ca(d.path / "ca");
  issue_options o;
  o.not_before = std::chrono::system_clock::now() - std::chrono::hours(48);
  o.not_after = std::chrono::system_clock::now() - std::chrono::hours(24);
  const auto files = issue_certificate(d.path / "ca", "late", o, d.path / "nodes");
  CHECK(files.key == d.path / "nodes" / "late.key");
  CHECK(read_certificate_info(files.cert).not_after < std::chrono::system_clock::now());
  CHECK(error_of([&] {
          check_node_files(d.path / "ca" / "ca.crt", files.cert, files.key);
        }).find("certificate has expired") != std::string::npos);
  CHECK(error_of([&] {
          tls_context ctx(tls_files{d.path / "ca" / "ca.crt", files.cert, files.key, true});
        }).find("expired") != std::string::npos);
  // A board whose clock is wrong (no battery-backed clock, no NTP yet) is told so.
  o.not_before = std::chrono::system_clock::now() + std::chrono::hours(48);
  o.not_after = std::chrono::system_clock::now() + std::chrono::hours(96);
  const auto early = issue_certificate(d.path / "ca", "early", o, d.path / "nodes");
  const std::string e = error_of([&] { check_node_files(d.path / "ca" / "ca.crt", early.cert, early.key); });
  CHECK_MESSAGE(e.find("certificate is not yet valid (valid from ") != std::string::npos, e);
  CHECK_MESSAGE(e.find(" UTC; this machine's clock reads ") != std::string::npos, e);
}

TEST_CASE("issuing without a CA says to run `cleave certs init`") {
  temp_dir d;
  issue_options o;
  CHECK(error_of([&] { issue_certificate(d.path, "n1", o); }).find("run `cleave certs init` first") !=
        std::string::npos);
}

TEST_CASE("issuing with a CA key that does not match the CA certificate fails clearly") {
  temp_dir a, b;
  init_ca(a.path);
  init_ca(b.path);
  fs::copy_file(b.path / "ca.key", a.path / "ca.key", fs::copy_options::overwrite_existing);
  issue_options o;
  CHECK(error_of([&] { issue_certificate(a.path, "n1", o); }).find("does not match CA certificate") !=
        std::string::npos);
}

TEST_CASE("a CA file that is not a certificate is reported as such") {
  temp_dir d;
  init_ca(d.path);
  fs::copy_file(d.path / "ca.key", d.path / "ca.crt", fs::copy_options::overwrite_existing);
  issue_options o;
  CHECK(error_of([&] { issue_certificate(d.path, "n1", o); }).find("is not a PEM certificate") != std::string::npos);
}

TEST_CASE("bad node names and existing certificates are refused") {
  temp_dir d;
  init_ca(d.path);
  issue_options o;
  for (const char* bad : {"", "-x", "a/b", "a b", "../up", "\xc3\xa9t\xc3\xa9"}) {
    CAPTURE(bad);
    CHECK(error_of([&] { issue_certificate(d.path, bad, o); }).find("invalid node name") != std::string::npos);
  }
  CHECK_FALSE(valid_node_name(std::string(65, 'a')));
  CHECK(valid_node_name(std::string(64, 'a')));
  issue_certificate(d.path, "n1", o);
  CHECK(error_of([&] { issue_certificate(d.path, "n1", o); }).find("already exists") != std::string::npos);
  o.overwrite = true;
  CHECK_NOTHROW(issue_certificate(d.path, "n1", o));
}

TEST_CASE("a TLS context names the missing or mismatched file") {
  temp_dir d;
  temp_dir other;
  init_ca(d.path);
  init_ca(other.path);
  issue_options o;
  issue_certificate(d.path, "n1", o);
  issue_certificate(d.path, "n2", o);
  issue_certificate(other.path, "n3", o);
  CHECK(error_of([&] { tls_context c(tls_files_in(d.path, "nobody")); }).find("certificate not found") !=
        std::string::npos);
  CHECK(error_of([&] {
          tls_context c(tls_files{d.path / "missing.crt", d.path / "n1.crt", d.path / "n1.key"});
        }).find("CA certificate not found") != std::string::npos);
  CHECK(error_of([&] {
          tls_context c(tls_files{d.path / "ca.crt", d.path / "n1.crt", d.path / "n2.key"});
        }).find("does not match certificate") != std::string::npos);
  CHECK(error_of([&] {
          tls_context c(tls_files{d.path / "ca.crt", other.path / "n3.crt", other.path / "n3.key"});
        }).find("does not verify against CA") != std::string::npos);
  CHECK(error_of([&] {
          tls_context c(tls_files{d.path / "n1.crt", d.path / "n1.crt", d.path / "n1.key"});
        }).find("is not a CA") != std::string::npos);
}
