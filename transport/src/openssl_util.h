// OpenSSL helpers shared by the certificate, TLS context and stream code: owning pointers,
// the error queue as text, CLEAVE_CHECK_SSL, and reading names out of certificates.
#pragma once

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "cleave/core/error.h"
#include "cleave/core/tier.h"

namespace cleave::transport::detail {

template <auto Free>
struct ssl_deleter {
  template <class T>
  void operator()(T* p) const {
    Free(p);
  }
};
using x509_ptr = std::unique_ptr<X509, ssl_deleter<X509_free>>;
using evp_pkey_ptr = std::unique_ptr<EVP_PKEY, ssl_deleter<EVP_PKEY_free>>;
using bio_ptr = std::unique_ptr<BIO, ssl_deleter<BIO_free_all>>;
using x509_store_ptr = std::unique_ptr<X509_STORE, ssl_deleter<X509_STORE_free>>;
using x509_store_ctx_ptr = std::unique_ptr<X509_STORE_CTX, ssl_deleter<X509_STORE_CTX_free>>;
using x509_name_ptr = std::unique_ptr<X509_NAME, ssl_deleter<X509_NAME_free>>;
using x509_extension_ptr = std::unique_ptr<X509_EXTENSION, ssl_deleter<X509_EXTENSION_free>>;
using bignum_ptr = std::unique_ptr<BIGNUM, ssl_deleter<BN_free>>;
using x509_crl_ptr = std::unique_ptr<X509_CRL, ssl_deleter<X509_CRL_free>>;
using x509_revoked_ptr = std::unique_ptr<X509_REVOKED, ssl_deleter<X509_REVOKED_free>>;
using asn1_integer_ptr = std::unique_ptr<ASN1_INTEGER, ssl_deleter<ASN1_INTEGER_free>>;
using asn1_time_ptr = std::unique_ptr<ASN1_TIME, ssl_deleter<ASN1_TIME_free>>;

// Drains the OpenSSL error queue into one line ("" when empty).
std::string openssl_errors();

// Throws core::error naming the failing call and what OpenSSL reported.
[[noreturn]] void throw_openssl(const char* expr, const char* file, int line);

// Reads a PEM certificate / private key; throws core::error with `what` and the path on failure.
x509_ptr load_certificate(const std::filesystem::path& path, const char* what);
evp_pkey_ptr load_private_key(const std::filesystem::path& path, const char* what);
// Reads a PEM certificate revocation list; throws core::error with `what` and the path on failure.
x509_crl_ptr load_crl(const std::filesystem::path& path, const char* what);
std::string pem_of_crl(X509_CRL* crl);

// The certificate's subject common name ("" when absent).
std::string common_name(const X509* cert);
// The subject entry `nid` as UTF-8 ("" when absent).
std::string subject_entry(const X509* cert, int nid);
// The role written in the subject's organizational unit, if any.
std::optional<core::tier> certificate_role(const X509* cert);
// The node id a certificate binds (see certs.h: node_id_of).
std::optional<std::uint32_t> certificate_node_id(const X509* cert);

std::chrono::system_clock::time_point asn1_time_point(const ASN1_TIME* t);
// "2026-03-01" (UTC).
std::string date_text(std::chrono::system_clock::time_point t);
// OpenSSL's text for a verification error `err` of `cert`; for a certificate not yet valid or
// expired also its validity and this machine's clock (a board without a battery-backed clock
// boots in 1970 until NTP sets it).
std::string verify_error_text(int err, const X509* cert);

// A serial number as upper-case hex without leading zeros ("0" for zero), the form revocation
// lists are compared in.
std::string serial_hex(const ASN1_INTEGER* serial);

// Why `crl` is not a revocation list of the CA `ca` (issuer name, signature), or nothing.
std::optional<std::string> crl_problem(X509_CRL* crl, X509* ca);

// Verifies `cert` against the CA in `ca` at the current time; returns why it fails, or nothing.
std::optional<std::string> verify_against(X509* cert, X509* ca);

}  // namespace cleave::transport::detail

// Vendor API failure: OpenSSL returned 0 / null.
#define CLEAVE_CHECK_SSL(expr)                                                          \
  do {                                                                                  \
    if (!(expr)) ::cleave::transport::detail::throw_openssl(#expr, __FILE__, __LINE__); \
  } while (0)
