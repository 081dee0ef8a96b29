// TLS configuration of a node: the federation CA it trusts, its own certificate and key, the CA's
// revocation list, TLS 1.3 only, peer certificates required both ways. One context serves
// listeners and connections; reload() swaps in new files for the handshakes that follow.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cleave/core/tier.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct x509_st X509;

namespace cleave::transport {

struct tls_files {
  std::filesystem::path ca;    // the federation CA certificate (PEM)
  std::filesystem::path cert;  // this node's certificate (PEM); may be empty only for a client in tests
  std::filesystem::path key;   // this node's private key (PEM)
  // Check at load time that the key matches the certificate and that the certificate is signed
  // by the CA and valid now. Off only to build deliberately misconfigured peers in tests.
  bool check_own_certificate = true;
  // The CA's revocation list (PEM). Every peer certificate is checked against it at the
  // handshake. Empty, or a file that does not exist (yet): nothing is revoked.
  std::filesystem::path crl = {};
};

// Files of node `name` inside a directory written by `cleave certs` (the list: ca.crl there).
tls_files tls_files_in(const std::filesystem::path& dir, const std::string& name);

// A certificate that expires within this many days is warned about: this node's own at load and
// reload, a peer's at its handshake (once per certificate).
inline constexpr int expiry_warning_days = 30;

// A shared handle to a node's TLS state; cheap to copy. Copies share one state: a reload through
// any of them is seen by all (a listener, the node's connections).
class tls_context {
 public:
  // Throws core::error naming the missing or mismatched file.
  explicit tls_context(const tls_files& files);

  // Reads the files again and, if they are all good, makes new handshakes use them; channels
  // already open keep the session they have. Returns what was loaded, for the log. Throws
  // core::error with the reason, keeping the current state, when a file is missing or bad, the
  // certificate names another node (name, role or bound id: restart to change those), or a
  // revocation list in use is gone. Thread-safe.
  std::string reload();

  // This node's identity: the common name of its certificate ("" without one); fixed for the life
  // of the context.
  const std::string& identity() const { return identity_; }
  std::optional<core::tier> role() const { return role_; }
  std::optional<std::uint32_t> node_id() const { return node_id_; }  // as certs.h reads it
  bool has_certificate() const { return !identity_.empty(); }

  // The OpenSSL context new handshakes use; an SSL made from it holds its own reference.
  std::shared_ptr<SSL_CTX> current() const;
  // current().get(): valid until the next reload (tests only).
  SSL_CTX* native() const { return current().get(); }

  // Thread-safe: whether the revocation list in use lists this serial (upper-case hex).
  bool revokes(const std::string& serial) const;
  // Thread-safe: the revocation list in use (DER, signed by the CA), empty without one. Servers
  // and edges pass it down, so that a revocation reaches every tier without a reload there.
  std::vector<std::uint8_t> revocation_list() const;
  // A list received from upstream: put in force for new handshakes (and saved over this node's
  // list file, when it has one) when it is the CA's, valid now and newer than the one in force
  // (a higher CRL number, or a later lastUpdate). Returns what is now in force, for the log, or
  // nullopt when it is not newer; throws core::error saying what is wrong with it. Thread-safe.
  std::optional<std::string> adopt_revocation_list(std::span<const std::uint8_t> der);
  // Thread-safe: a peer's certificate passed the handshake; warns once per certificate when it
  // expires within expiry_warning_days.
  void note_peer(X509* cert, const std::string& remote) const;

  // Statements a node vouches for beyond its channels (a device's round keys, relayed by a server
  // it need not trust): its certificate (DER; empty without one), and `message` signed with its
  // private key (SHA-256; core::error naming the failing call).
  std::vector<std::uint8_t> certificate_der() const;
  std::vector<std::uint8_t> sign(std::span<const std::uint8_t> message) const;
  // The node a DER certificate names, once checked as a handshake checks a peer's (signed by the
  // federation CA, valid now, not on the revocation list in use) and once `signature` verifies
  // `message` under its key. Throws core::error saying which check failed. Thread-safe.
  struct vouched {
    std::string identity;
    std::optional<core::tier> role;
    std::optional<std::uint32_t> node_id;
  };
  vouched verify_signed(std::span<const std::uint8_t> certificate, std::span<const std::uint8_t> message,
                        std::span<const std::uint8_t> signature) const;

  struct state;

 private:
  std::shared_ptr<state> state_;
  std::string identity_;
  std::optional<core::tier> role_;
  std::optional<std::uint32_t> node_id_;
};

}  // namespace cleave::transport
