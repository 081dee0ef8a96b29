// TLS configuration of a node: the federation CA it trusts, its own certificate and key, TLS 1.3
// only, peer certificates required both ways. One context serves listeners and connections.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "cleave/core/tier.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace cleave::transport {

struct tls_files {
  std::filesystem::path ca;    // the federation CA certificate (PEM)
  std::filesystem::path cert;  // this node's certificate (PEM); may be empty only for a client in tests
  std::filesystem::path key;   // this node's private key (PEM)
  // Check at load time that the key matches the certificate and that the certificate is signed
  // by the CA and valid now. Off only to build deliberately misconfigured peers in tests.
  bool check_own_certificate = true;
};

// Files of node `name` inside a directory written by `cleave certs`.
tls_files tls_files_in(const std::filesystem::path& dir, const std::string& name);

// A shared handle to an OpenSSL context; cheap to copy.
class tls_context {
 public:
  // Throws core::error naming the missing or mismatched file.
  explicit tls_context(const tls_files& files);

  // This node's identity: the common name of its certificate ("" without one).
  const std::string& identity() const { return identity_; }
  std::optional<core::tier> role() const { return role_; }
  std::optional<std::uint32_t> node_id() const { return node_id_; }  // as certs.h reads it
  bool has_certificate() const { return !identity_.empty(); }

  SSL_CTX* native() const { return ctx_.get(); }

 private:
  struct ctx_free {
    void operator()(SSL_CTX* c) const;
  };
  std::shared_ptr<SSL_CTX> ctx_;
  std::string identity_;
  std::optional<core::tier> role_;
  std::optional<std::uint32_t> node_id_;
};

}  // namespace cleave::transport
