// TLS 1.3-only OpenSSL context with mutual authentication against the federation CA, checked
// against the CA's revocation list; reloadable for new handshakes.
#include "cleave/transport/tls_context.h"

#include <mutex>
#include <set>
#include <utility>

#include "cleave/core/atomic_file.h"
#include "cleave/transport/certs.h"
#include "cleave/transport/log.h"
#include "openssl_util.h"

namespace cleave::transport {

using namespace detail;
namespace fs = std::filesystem;

namespace {

struct ssl_ctx_free {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};

// What one load of the files gives.
struct loaded {
  std::shared_ptr<SSL_CTX> ctx;
  std::string identity;
  std::optional<core::tier> role;
  std::optional<std::uint32_t> node_id;
  std::string serial;                             // of this node's certificate
  std::chrono::system_clock::time_point expires;  // this node's certificate
  bool has_crl = false;
  std::set<std::string> revoked;  // serials on the list
  std::string summary;            // for the log
  x509_ptr ca;
  std::vector<std::uint8_t> crl_der;            // the list in force (DER), empty without one
  std::pair<std::int64_t, std::int64_t> order;  // of that list: its CRL number, then its lastUpdate
};

// Which of two lists of one CA is the newer: the higher CRL number (`cleave certs revoke` counts
// them), then the later lastUpdate.
std::pair<std::int64_t, std::int64_t> order_of(X509_CRL* crl) {
  std::int64_t number = -1;
  if (auto* n = static_cast<ASN1_INTEGER*>(X509_CRL_get_ext_d2i(crl, NID_crl_number, nullptr, nullptr))) {
    if (ASN1_INTEGER_get_int64(&number, n) != 1) number = -1;
    ASN1_INTEGER_free(n);
  }
  ERR_clear_error();
  const auto t = asn1_time_point(X509_CRL_get0_lastUpdate(crl));
  return {number, std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count()};
}

// A revocation list that is the CA's and in force now; `what` names where it came from.
void check_crl(X509_CRL* crl, X509* ca, const std::string& what, const tls_files& files) {
  if (auto why = crl_problem(crl, ca))
    throw core::error(what + " is not the CA's (" + files.ca.string() + "): " + *why);
  const auto now = std::chrono::system_clock::now();
  const auto from = asn1_time_point(X509_CRL_get0_lastUpdate(crl));
  if (from > now)
    throw core::error(what + " is not valid before " + date_text(from) + " (is this machine's clock behind?)");
  if (const ASN1_TIME* next = X509_CRL_get0_nextUpdate(crl); next && asn1_time_point(next) < now)
    throw core::error(what + " expired on " + date_text(asn1_time_point(next)) +
                      " (write a new one with `cleave certs revoke`)");
}

std::vector<std::uint8_t> der_of(X509_CRL* crl) {
  const int n = i2d_X509_CRL(crl, nullptr);
  CLEAVE_CHECK_SSL(n > 0);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(n));
  unsigned char* at = out.data();
  CLEAVE_CHECK_SSL(i2d_X509_CRL(crl, &at) == n);
  return out;
}

int days_until(std::chrono::system_clock::time_point t) {
  return static_cast<int>(std::chrono::duration_cast<std::chrono::hours>(t - std::chrono::system_clock::now()).count() /
                          24);
}

bool expires_soon(std::chrono::system_clock::time_point t) {
  return t - std::chrono::system_clock::now() < std::chrono::hours(24 * expiry_warning_days);
}

// `received`: a list of the CA's that came over a channel (tls_context::adopt_revocation_list),
// in force instead of the file's when newer.
loaded load(const tls_files& files, X509_CRL* received = nullptr) {
  loaded out;
  x509_ptr ca = load_certificate(files.ca, "CA certificate");
  if (X509_check_ca(ca.get()) <= 0) throw core::error("CA certificate " + files.ca.string() + " is not a CA");
  x509_ptr cert;
  evp_pkey_ptr key;
  if (!files.cert.empty() || !files.key.empty()) {
    cert = load_certificate(files.cert, "certificate");
    key = load_private_key(files.key, "key");
    std::error_code ec;
    const auto perms = fs::status(files.key, ec).permissions();
    using p = fs::perms;
    if (!ec && (perms & (p::group_all | p::others_all)) != p::none)
      logger()->warn("private key {} can be read by other users (mode {:o}); make it private: chmod 600 {}",
                     files.key.string(), static_cast<unsigned>(perms) & 0777, files.key.string());
    if (X509_check_private_key(cert.get(), key.get()) != 1) {
      ERR_clear_error();
      throw core::error("key " + files.key.string() + " does not match certificate " + files.cert.string());
    }
    if (files.check_own_certificate)
      if (auto why = verify_against(cert.get(), ca.get()))
        throw core::error("certificate " + files.cert.string() + " does not verify against CA " + files.ca.string() +
                          ": " + *why);
    out.identity = common_name(cert.get());
    out.role = certificate_role(cert.get());
    out.node_id = certificate_node_id(cert.get());
    out.serial = serial_hex(X509_get0_serialNumber(cert.get()));
    out.expires = asn1_time_point(X509_get0_notAfter(cert.get()));
    if (out.identity.empty()) throw core::error("certificate " + files.cert.string() + " has no common name");
  }

  x509_crl_ptr crl;
  std::error_code ec;
  std::string crl_from;
  if (!files.crl.empty() && fs::exists(files.crl, ec)) {
    crl = load_crl(files.crl, "revocation list");
    check_crl(crl.get(), ca.get(), "revocation list " + files.crl.string(), files);
    crl_from = files.crl.string();
  }
  if (received && (!crl || order_of(received) > order_of(crl.get()))) {
    crl.reset(X509_CRL_dup(received));
    CLEAVE_CHECK_SSL(crl);
    crl_from = "received from upstream";
  }
  if (crl) {
    const STACK_OF(X509_REVOKED)* revs = X509_CRL_get_REVOKED(crl.get());
    for (int i = 0; revs && i < sk_X509_REVOKED_num(revs); ++i)
      out.revoked.insert(serial_hex(X509_REVOKED_get0_serialNumber(sk_X509_REVOKED_value(revs, i))));
    out.has_crl = true;
    out.crl_der = der_of(crl.get());
    out.order = order_of(crl.get());
  }

  SSL_CTX* raw = SSL_CTX_new(TLS_method());
  CLEAVE_CHECK_SSL(raw);
  out.ctx.reset(raw, ssl_ctx_free{});
  CLEAVE_CHECK_SSL(SSL_CTX_set_min_proto_version(raw, TLS1_3_VERSION));
  CLEAVE_CHECK_SSL(SSL_CTX_set_max_proto_version(raw, TLS1_3_VERSION));
  // AES-128-GCM first: the fastest with AES-NI; all three are TLS 1.3 AEADs.
  CLEAVE_CHECK_SSL(
      SSL_CTX_set_ciphersuites(raw, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"));
  CLEAVE_CHECK_SSL(SSL_CTX_set1_groups_list(raw, "X25519:P-256"));
  // No session resumption: every connection authenticates in full (and meets the current list).
  SSL_CTX_set_options(raw, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_num_tickets(raw, 0);
  SSL_CTX_set_session_cache_mode(raw, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(raw, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Fewer read calls on large transfers.
  SSL_CTX_set_read_ahead(raw, 1);
  SSL_CTX_set_default_read_buffer_len(raw, 128 * 1024);

  X509_STORE* store = SSL_CTX_get_cert_store(raw);
  CLEAVE_CHECK_SSL(X509_STORE_add_cert(store, ca.get()));
  if (crl) {
    CLEAVE_CHECK_SSL(X509_STORE_add_crl(store, crl.get()));
    // The peer's certificate (the chain is CA -> node) must not be on the list.
    CLEAVE_CHECK_SSL(X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK));
  }
  if (cert) {
    CLEAVE_CHECK_SSL(SSL_CTX_use_certificate(raw, cert.get()) == 1);
    CLEAVE_CHECK_SSL(SSL_CTX_use_PrivateKey(raw, key.get()) == 1);
    CLEAVE_CHECK_SSL(SSL_CTX_check_private_key(raw) == 1);
  }
  // Both sides require and verify the peer's certificate; streams install their own callback
  // for identity checks (tls_stream).
  SSL_CTX_set_verify(raw, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_verify_depth(raw, 2);

  if (cert)
    out.summary =
        "certificate '" + out.identity + "' (serial " + out.serial + ", expires " + date_text(out.expires) + ")";
  else
    out.summary = "no certificate";
  out.summary += ", CA " + files.ca.string();
  if (out.has_crl)
    out.summary += ", revocation list " + crl_from + " (" + std::to_string(out.revoked.size()) +
                   (out.revoked.size() == 1 ? " entry" : " entries") +
                   (out.order.first >= 0 ? ", number " + std::to_string(out.order.first) : std::string()) + ")";
  else
    out.summary += ", no revocation list";
  out.ca = std::move(ca);
  return out;
}

// Warnings about a freshly loaded state: this node's certificate expiring or on the list.
void warn_about(const loaded& l, const tls_files& files) {
  if (l.identity.empty()) return;
  if (expires_soon(l.expires))
    logger()->warn("certificate '{}' of this node ({}) expires in {} days, on {}: renew it (`cleave certs renew {}`)",
                   l.identity, files.cert.string(), days_until(l.expires), date_text(l.expires), l.identity);
  if (l.revoked.count(l.serial))
    logger()->warn("certificate '{}' of this node (serial {}) is on the revocation list {}: peers will refuse it",
                   l.identity, l.serial, files.crl.string());
}

// Throws core::error when a fresh load of the files names another node than the one in force.
void keep_identity(const loaded& next, const std::string& identity, const std::optional<core::tier>& role,
                   const std::optional<std::uint32_t>& node_id, const tls_files& files) {
  const auto same = [](const auto& a, const auto& b) { return a == b; };
  if (!same(next.identity, identity) || !same(next.role, role) || !same(next.node_id, node_id))
    throw core::error("certificate " + files.cert.string() + " is for '" + next.identity + "' (" +
                      (next.role ? std::string(core::tier_name(*next.role)) : std::string("no role")) +
                      (next.node_id ? ", id " + std::to_string(*next.node_id) : std::string()) +
                      "), not for this node '" + identity + "' (" +
                      (role ? std::string(core::tier_name(*role)) : std::string("no role")) +
                      (node_id ? ", id " + std::to_string(*node_id) : std::string()) +
                      "); a reload keeps the node's identity (restart it to change that)");
}

}  // namespace

struct tls_context::state {
  tls_files files;
  mutable std::mutex mu;
  loaded now;                            // guarded by mu
  x509_crl_ptr received;                 // the newest list received from upstream, if any; guarded by mu
  mutable std::set<std::string> warned;  // peer certificates warned about (name + serial); guarded by mu
};

tls_files tls_files_in(const fs::path& dir, const std::string& name) {
  return tls_files{dir / ca_cert_file, dir / (name + ".crt"), dir / (name + ".key"), true, dir / ca_crl_file};
}

tls_context::tls_context(const tls_files& files) : state_(std::make_shared<state>()) {
  state_->files = files;
  state_->now = load(files);
  identity_ = state_->now.identity;
  role_ = state_->now.role;
  node_id_ = state_->now.node_id;
  warn_about(state_->now, files);
}

std::string tls_context::reload() {
  x509_crl_ptr received;
  {
    std::lock_guard lock(state_->mu);
    if (state_->received) received.reset(X509_CRL_dup(state_->received.get()));
  }
  loaded next = load(state_->files, received.get());
  keep_identity(next, identity_, role_, node_id_, state_->files);
  std::string summary = next.summary;
  {
    std::lock_guard lock(state_->mu);
    if (state_->now.has_crl && !next.has_crl)
      throw core::error("revocation list " + state_->files.crl.string() +
                        " is gone; a reload does not drop the revocations in force (restart the node to run without "
                        "a list)");
    state_->now = std::move(next);
    warn_about(state_->now, state_->files);
  }
  return summary;
}

std::shared_ptr<SSL_CTX> tls_context::current() const {
  std::lock_guard lock(state_->mu);
  return state_->now.ctx;
}

std::vector<std::uint8_t> tls_context::revocation_list() const {
  std::lock_guard lock(state_->mu);
  return state_->now.crl_der;
}

std::optional<std::string> tls_context::adopt_revocation_list(std::span<const std::uint8_t> der) {
  const unsigned char* at = der.data();
  x509_crl_ptr crl(d2i_X509_CRL(nullptr, &at, static_cast<long>(der.size())));
  if (!crl || at != der.data() + der.size()) {
    ERR_clear_error();
    throw core::error("a revocation list of " + std::to_string(der.size()) + " bytes that does not parse");
  }
  const auto order = order_of(crl.get());
  {
    std::lock_guard lock(state_->mu);
    check_crl(crl.get(), state_->now.ca.get(), "the revocation list received", state_->files);
    if (state_->now.has_crl && !(order > state_->now.order)) return std::nullopt;  // not newer
  }
  loaded next = load(state_->files, crl.get());
  keep_identity(next, identity_, role_, node_id_, state_->files);
  std::string summary = next.summary;
  const std::string pem = pem_of_crl(crl.get());
  {
    std::lock_guard lock(state_->mu);
    if (state_->now.has_crl && !(next.order > state_->now.order)) return std::nullopt;  // a newer one came meanwhile
    state_->received = std::move(crl);
    state_->now = std::move(next);
    warn_about(state_->now, state_->files);
  }
  // Kept for a restart before the upstream link is back (best effort: the node's files may be
  // read-only; the list in memory is in force either way).
  if (!state_->files.crl.empty()) try {
      core::write_file_atomically(state_->files.crl, pem, 0644);
    } catch (const core::error& e) {
      logger()->warn("the revocation list received is in force but not saved: {}", e.what());
    }
  return summary;
}

bool tls_context::revokes(const std::string& serial) const {
  std::lock_guard lock(state_->mu);
  return state_->now.revoked.count(serial) != 0;
}

void tls_context::note_peer(X509* cert, const std::string& remote) const {
  if (!cert) return;
  const auto expires = asn1_time_point(X509_get0_notAfter(cert));
  if (!expires_soon(expires)) return;
  const std::string name = common_name(cert);
  const std::string serial = serial_hex(X509_get0_serialNumber(cert));
  {
    std::lock_guard lock(state_->mu);
    // Bounded: a federation has few certificates, but a peer renewed every minute must not grow it.
    if (state_->warned.size() >= 4096) state_->warned.clear();
    if (!state_->warned.insert(name + "/" + serial).second) return;
  }
  logger()->warn("certificate '{}' of peer {} expires in {} days, on {}: renew it (`cleave certs renew {}`)", name,
                 remote, days_until(expires), date_text(expires), name);
}

std::vector<std::uint8_t> tls_context::certificate_der() const {
  const auto ctx = current();
  X509* cert = SSL_CTX_get0_certificate(ctx.get());
  if (!cert) return {};
  const int n = i2d_X509(cert, nullptr);
  CLEAVE_CHECK_SSL(n > 0);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(n));
  unsigned char* at = out.data();
  CLEAVE_CHECK_SSL(i2d_X509(cert, &at) == n);
  return out;
}

namespace {

struct md_ctx_free {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using md_ctx_ptr = std::unique_ptr<EVP_MD_CTX, md_ctx_free>;
struct store_ctx_free {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};

// SHA-256 for EC and RSA keys; none for the keys that hash themselves (Ed25519, Ed448).
const EVP_MD* digest_for(const EVP_PKEY* key) {
  const int id = EVP_PKEY_get_base_id(key);
  return id == EVP_PKEY_ED25519 || id == EVP_PKEY_ED448 ? nullptr : EVP_sha256();
}

}  // namespace

std::vector<std::uint8_t> tls_context::sign(std::span<const std::uint8_t> message) const {
  const auto ctx = current();
  EVP_PKEY* key = SSL_CTX_get0_privatekey(ctx.get());
  if (!key) throw core::error("this node has no private key to sign with");
  md_ctx_ptr md(EVP_MD_CTX_new());
  CLEAVE_CHECK_SSL(md);
  CLEAVE_CHECK_SSL(EVP_DigestSignInit(md.get(), nullptr, digest_for(key), nullptr, key) == 1);
  std::size_t n = 0;
  CLEAVE_CHECK_SSL(EVP_DigestSign(md.get(), nullptr, &n, message.data(), message.size()) == 1);
  std::vector<std::uint8_t> sig(n);
  CLEAVE_CHECK_SSL(EVP_DigestSign(md.get(), sig.data(), &n, message.data(), message.size()) == 1);
  sig.resize(n);
  return sig;
}

tls_context::vouched tls_context::verify_signed(std::span<const std::uint8_t> certificate,
                                                std::span<const std::uint8_t> message,
                                                std::span<const std::uint8_t> signature) const {
  const unsigned char* at = certificate.data();
  x509_ptr cert(d2i_X509(nullptr, &at, static_cast<long>(certificate.size())));
  if (!cert || at != certificate.data() + certificate.size()) {
    ERR_clear_error();
    throw core::error("a certificate of " + std::to_string(certificate.size()) + " bytes that does not parse");
  }
  const std::string name = common_name(cert.get());
  {
    // Against the store the handshakes use: the federation CA and the revocation list in force.
    const auto ctx = current();
    std::unique_ptr<X509_STORE_CTX, store_ctx_free> check(X509_STORE_CTX_new());
    CLEAVE_CHECK_SSL(check);
    CLEAVE_CHECK_SSL(X509_STORE_CTX_init(check.get(), SSL_CTX_get_cert_store(ctx.get()), cert.get(), nullptr) == 1);
    if (X509_verify_cert(check.get()) != 1) {
      const int err = X509_STORE_CTX_get_error(check.get());
      ERR_clear_error();
      throw core::error("certificate '" + name + "': " + verify_error_text(err, cert.get()));
    }
  }
  EVP_PKEY* key = X509_get0_pubkey(cert.get());
  if (!key) throw core::error("certificate '" + name + "' holds no usable public key");
  md_ctx_ptr md(EVP_MD_CTX_new());
  CLEAVE_CHECK_SSL(md);
  CLEAVE_CHECK_SSL(EVP_DigestVerifyInit(md.get(), nullptr, digest_for(key), nullptr, key) == 1);
  if (EVP_DigestVerify(md.get(), signature.data(), signature.size(), message.data(), message.size()) != 1) {
    ERR_clear_error();
    throw core::error("the signature does not verify under the key of certificate '" + name + "'");
  }
  return {name, certificate_role(cert.get()), certificate_node_id(cert.get())};
}

}  // namespace cleave::transport
