// TLS 1.3-only OpenSSL context with mutual authentication against the federation CA.
#include "cleave/transport/tls_context.h"

#include <spdlog/spdlog.h>

#include "cleave/transport/certs.h"
#include "openssl_util.h"

namespace cleave::transport {

using namespace detail;

void tls_context::ctx_free::operator()(SSL_CTX* c) const {
  SSL_CTX_free(c);
}

tls_files tls_files_in(const std::filesystem::path& dir, const std::string& name) {
  return tls_files{dir / ca_cert_file, dir / (name + ".crt"), dir / (name + ".key"), true};
}

tls_context::tls_context(const tls_files& files) {
  const x509_ptr ca = load_certificate(files.ca, "CA certificate");
  if (X509_check_ca(ca.get()) <= 0) throw core::error("CA certificate " + files.ca.string() + " is not a CA");
  x509_ptr cert;
  evp_pkey_ptr key;
  if (!files.cert.empty() || !files.key.empty()) {
    cert = load_certificate(files.cert, "certificate");
    key = load_private_key(files.key, "key");
    std::error_code ec;
    const auto perms = std::filesystem::status(files.key, ec).permissions();
    using p = std::filesystem::perms;
    if (!ec && (perms & (p::group_all | p::others_all)) != p::none)
      spdlog::warn("private key {} can be read by other users (mode {:o}); make it private: chmod 600 {}",
                   files.key.string(), static_cast<unsigned>(perms) & 0777, files.key.string());
    if (X509_check_private_key(cert.get(), key.get()) != 1) {
      ERR_clear_error();
      throw core::error("key " + files.key.string() + " does not match certificate " + files.cert.string());
    }
    if (files.check_own_certificate)
      if (auto why = verify_against(cert.get(), ca.get()))
        throw core::error("certificate " + files.cert.string() + " does not verify against CA " + files.ca.string() +
                          ": " + *why);
    identity_ = common_name(cert.get());
    role_ = certificate_role(cert.get());
    node_id_ = certificate_node_id(cert.get());
    if (identity_.empty()) throw core::error("certificate " + files.cert.string() + " has no common name");
  }

  SSL_CTX* raw = SSL_CTX_new(TLS_method());
  CLEAVE_CHECK_SSL(raw);
  ctx_.reset(raw, ctx_free{});
  CLEAVE_CHECK_SSL(SSL_CTX_set_min_proto_version(raw, TLS1_3_VERSION));
  CLEAVE_CHECK_SSL(SSL_CTX_set_max_proto_version(raw, TLS1_3_VERSION));
  // AES-128-GCM first: the fastest with AES-NI; all three are TLS 1.3 AEADs.
  CLEAVE_CHECK_SSL(
      SSL_CTX_set_ciphersuites(raw, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"));
  CLEAVE_CHECK_SSL(SSL_CTX_set1_groups_list(raw, "X25519:P-256"));
  // No session resumption: every connection authenticates in full.
  SSL_CTX_set_options(raw, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_num_tickets(raw, 0);
  SSL_CTX_set_session_cache_mode(raw, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(raw, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Fewer read calls on large transfers.
  SSL_CTX_set_read_ahead(raw, 1);
  SSL_CTX_set_default_read_buffer_len(raw, 128 * 1024);

  X509_STORE* store = SSL_CTX_get_cert_store(raw);
  CLEAVE_CHECK_SSL(X509_STORE_add_cert(store, ca.get()));
  if (cert) {
    CLEAVE_CHECK_SSL(SSL_CTX_use_certificate(raw, cert.get()) == 1);
    CLEAVE_CHECK_SSL(SSL_CTX_use_PrivateKey(raw, key.get()) == 1);
    CLEAVE_CHECK_SSL(SSL_CTX_check_private_key(raw) == 1);
  }
  // Both sides require and verify the peer's certificate; streams install their own callback
  // for identity checks (tls_stream).
  SSL_CTX_set_verify(raw, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_verify_depth(raw, 2);
}

}  // namespace cleave::transport
