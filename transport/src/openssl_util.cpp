// OpenSSL helpers: error text, PEM loading with clear messages, certificate names.
#include "openssl_util.h"

#include "cleave/transport/certs.h"

#include <openssl/pem.h>

#include <ctime>
#include <system_error>

namespace cleave::transport::detail {

std::string openssl_errors() {
  std::string s;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!s.empty()) s += "; ";
    s += buf;
  }
  return s;
}

void throw_openssl(const char* expr, const char* file, int line) {
  std::string msg = std::string("OpenSSL call failed: ") + expr + " (" + file + ":" + std::to_string(line) + ")";
  const std::string errs = openssl_errors();
  if (!errs.empty()) msg += ": " + errs;
  throw core::error(msg);
}

namespace {

bio_ptr open_pem(const std::filesystem::path& path, const char* what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw core::error(std::string(what) + " not found: " + path.string());
  bio_ptr bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) {
    ERR_clear_error();
    throw core::error(std::string("cannot open ") + what + " " + path.string());
  }
  return bio;
}

}  // namespace

x509_ptr load_certificate(const std::filesystem::path& path, const char* what) {
  auto bio = open_pem(path, what);
  x509_ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) {
    const std::string errs = openssl_errors();
    throw core::error(std::string(what) + " " + path.string() + " is not a PEM certificate" +
                      (errs.empty() ? "" : " (" + errs + ")"));
  }
  return cert;
}

evp_pkey_ptr load_private_key(const std::filesystem::path& path, const char* what) {
  auto bio = open_pem(path, what);
  evp_pkey_ptr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) {
    const std::string errs = openssl_errors();
    throw core::error(std::string(what) + " " + path.string() + " is not a PEM private key" +
                      (errs.empty() ? "" : " (" + errs + ")"));
  }
  return key;
}

x509_crl_ptr load_crl(const std::filesystem::path& path, const char* what) {
  auto bio = open_pem(path, what);
  x509_crl_ptr crl(PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr));
  if (!crl) {
    const std::string errs = openssl_errors();
    throw core::error(std::string(what) + " " + path.string() + " is not a PEM certificate revocation list" +
                      (errs.empty() ? "" : " (" + errs + ")"));
  }
  return crl;
}

std::string subject_entry(const X509* cert, int nid) {
  const X509_NAME* name = X509_get_subject_name(cert);
  if (!name) return {};
  const int i = X509_NAME_get_index_by_NID(name, nid, -1);
  if (i < 0) return {};
  const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, data);
  if (n < 0) {
    ERR_clear_error();
    return {};
  }
  std::string s(reinterpret_cast<const char*>(utf8), static_cast<std::size_t>(n));
  OPENSSL_free(utf8);
  return s;
}

std::string common_name(const X509* cert) {
  return subject_entry(cert, NID_commonName);
}

std::optional<core::tier> certificate_role(const X509* cert) {
  return core::role_from_name(subject_entry(cert, NID_organizationalUnitName));
}

std::optional<std::uint32_t> certificate_node_id(const X509* cert) {
  return node_id_of(common_name(cert), subject_entry(cert, NID_serialNumber));
}

std::chrono::system_clock::time_point asn1_time_point(const ASN1_TIME* t) {
  struct tm tm {};
  if (!t || ASN1_TIME_to_tm(t, &tm) != 1) return {};
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

namespace {

std::string utc_text(std::chrono::system_clock::time_point t, const char* format) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string time_text(std::chrono::system_clock::time_point t) {
  return utc_text(t, "%Y-%m-%d %H:%M:%S UTC");
}

}  // namespace

std::string date_text(std::chrono::system_clock::time_point t) {
  return utc_text(t, "%Y-%m-%d");
}

std::string verify_error_text(int err, const X509* cert) {
  std::string text = X509_verify_cert_error_string(err);
  if (cert && (err == X509_V_ERR_CERT_NOT_YET_VALID || err == X509_V_ERR_CERT_HAS_EXPIRED))
    text += " (valid from " + time_text(asn1_time_point(X509_get0_notBefore(cert))) + " to " +
            time_text(asn1_time_point(X509_get0_notAfter(cert))) + "; this machine's clock reads " +
            time_text(std::chrono::system_clock::now()) + ")";
  return text;
}

std::string serial_hex(const ASN1_INTEGER* serial) {
  bignum_ptr bn(ASN1_INTEGER_to_BN(serial, nullptr));
  if (!bn) {
    ERR_clear_error();
    return "?";
  }
  char* hex = BN_bn2hex(bn.get());
  if (!hex) {
    ERR_clear_error();
    return "?";
  }
  std::string s(hex);
  OPENSSL_free(hex);
  return s;
}

std::optional<std::string> crl_problem(X509_CRL* crl, X509* ca) {
  if (X509_NAME_cmp(X509_CRL_get_issuer(crl), X509_get_subject_name(ca)) != 0)
    return std::string("it was issued by another CA");
  EVP_PKEY* pub = X509_get0_pubkey(ca);
  if (!pub || X509_CRL_verify(crl, pub) != 1) {
    const std::string errs = openssl_errors();
    return "its signature does not verify with the CA's key" + (errs.empty() ? std::string() : " (" + errs + ")");
  }
  return std::nullopt;
}

std::optional<std::string> verify_against(X509* cert, X509* ca) {
  x509_store_ptr store(X509_STORE_new());
  CLEAVE_CHECK_SSL(store);
  CLEAVE_CHECK_SSL(X509_STORE_add_cert(store.get(), ca));
  x509_store_ctx_ptr ctx(X509_STORE_CTX_new());
  CLEAVE_CHECK_SSL(ctx);
  CLEAVE_CHECK_SSL(X509_STORE_CTX_init(ctx.get(), store.get(), cert, nullptr));
  if (X509_verify_cert(ctx.get()) == 1) return std::nullopt;
  ERR_clear_error();
  return verify_error_text(X509_STORE_CTX_get_error(ctx.get()), X509_STORE_CTX_get_current_cert(ctx.get()));
}

std::string pem_of_crl(X509_CRL* crl) {
  bio_ptr bio(BIO_new(BIO_s_mem()));
  CLEAVE_CHECK_SSL(bio);
  CLEAVE_CHECK_SSL(PEM_write_bio_X509_CRL(bio.get(), crl));
  char* p = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &p);
  return std::string(p, static_cast<std::size_t>(n));
}

}  // namespace cleave::transport::detail
