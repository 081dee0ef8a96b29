// Federation provisioning with OpenSSL 3: CA creation, node key + certificate issuance, checks.
#include "cleave/transport/certs.h"

#include <fcntl.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "cleave/core/error.h"
#include "openssl_util.h"

namespace cleave::transport {

using namespace detail;
namespace fs = std::filesystem;

namespace {

evp_pkey_ptr new_ec_key() {
  evp_pkey_ptr key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  CLEAVE_CHECK_SSL(key);
  return key;
}

std::string pem_of_key(EVP_PKEY* key) {
  bio_ptr bio(BIO_new(BIO_s_mem()));
  CLEAVE_CHECK_SSL(bio);
  CLEAVE_CHECK_SSL(PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr));
  char* p = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &p);
  return std::string(p, static_cast<std::size_t>(n));
}

std::string pem_of_cert(X509* cert) {
  bio_ptr bio(BIO_new(BIO_s_mem()));
  CLEAVE_CHECK_SSL(bio);
  CLEAVE_CHECK_SSL(PEM_write_bio_X509(bio.get(), cert));
  char* p = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &p);
  return std::string(p, static_cast<std::size_t>(n));
}

// Writes `text` to `path` with `mode`, through a temporary file renamed into place.
void write_file(const fs::path& path, const std::string& text, mode_t mode) {
  const fs::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) throw core::error("cannot write " + tmp.string() + ": " + std::strerror(errno));
  bool ok = ::fchmod(fd, mode) == 0;
  std::size_t done = 0;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<std::size_t>(n);
  }
  const int err = errno;
  ok = (::fsync(fd) == 0) && ok;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw core::error("cannot write " + path.string() + ": " + std::strerror(err ? err : errno));
  }
}

void add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  x509_extension_ptr ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (!ext) throw_openssl(("X509V3_EXT_conf_nid(" + value + ")").c_str(), __FILE__, __LINE__);
  CLEAVE_CHECK_SSL(X509_add_ext(cert, ext.get(), -1));
}

void set_name(X509_NAME* name, const char* field, std::string_view value) {
  CLEAVE_CHECK_SSL(X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8,
                                              reinterpret_cast<const unsigned char*>(value.data()),
                                              static_cast<int>(value.size()), -1, 0));
}

void set_serial(X509* cert) {
  unsigned char bytes[16];
  CLEAVE_CHECK_SSL(RAND_bytes(bytes, sizeof bytes) == 1);
  bytes[0] &= 0x7f;  // positive
  bignum_ptr bn(BN_bin2bn(bytes, sizeof bytes, nullptr));
  CLEAVE_CHECK_SSL(bn);
  CLEAVE_CHECK_SSL(BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert)));
}

void set_validity(X509* cert, std::time_t from, std::time_t until) {
  CLEAVE_CHECK_SSL(ASN1_TIME_set(X509_getm_notBefore(cert), from));
  CLEAVE_CHECK_SSL(ASN1_TIME_set(X509_getm_notAfter(cert), until));
}

void refuse_existing(const fs::path& p, bool overwrite, const char* what) {
  std::error_code ec;
  if (!overwrite && fs::exists(p, ec))
    throw core::error(std::string(what) + " " + p.string() +
                      " already exists (pass overwrite / --force to replace it)");
}

void ensure_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw core::error("cannot create directory " + dir.string() + ": " + ec.message());
}

struct loaded_ca {
  x509_ptr cert;
  evp_pkey_ptr key;
};

loaded_ca load_ca(const fs::path& dir) {
  const fs::path cert_path = dir / ca_cert_file;
  const fs::path key_path = dir / ca_key_file;
  std::error_code ec;
  if (!fs::exists(cert_path, ec))
    throw core::error("CA certificate not found: " + cert_path.string() + " (run `cleave certs init` first)");
  if (!fs::exists(key_path, ec)) throw core::error("CA key not found: " + key_path.string());
  loaded_ca ca{load_certificate(cert_path, "CA certificate"), load_private_key(key_path, "CA key")};
  if (X509_check_ca(ca.cert.get()) <= 0)
    throw core::error("CA certificate " + cert_path.string() + " is not a CA certificate");
  if (X509_check_private_key(ca.cert.get(), ca.key.get()) != 1) {
    ERR_clear_error();
    throw core::error("CA key " + key_path.string() + " does not match CA certificate " + cert_path.string());
  }
  return ca;
}

}  // namespace

bool valid_node_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-'))) return false;
  }
  return true;
}

pem_paths init_ca(const fs::path& dir, const ca_options& opts) {
  if (opts.valid_days <= 0 || opts.valid_days > 36500) throw core::error("CA validity must be 1 to 36500 days");
  if (opts.name.empty() || opts.name.size() > 64) throw core::error("CA name must have 1 to 64 characters");
  ensure_dir(dir);
  const pem_paths out{dir / ca_cert_file, dir / ca_key_file};
  refuse_existing(out.cert, opts.overwrite, "CA certificate");
  refuse_existing(out.key, opts.overwrite, "CA key");

  auto key = new_ec_key();
  x509_ptr cert(X509_new());
  CLEAVE_CHECK_SSL(cert);
  CLEAVE_CHECK_SSL(X509_set_version(cert.get(), 2));
  set_serial(cert.get());
  const std::time_t now = std::time(nullptr);
  set_validity(cert.get(), now - 60, now + static_cast<std::time_t>(opts.valid_days) * 86400);
  X509_NAME* name = X509_get_subject_name(cert.get());
  set_name(name, "O", "cleave");
  set_name(name, "CN", opts.name);
  CLEAVE_CHECK_SSL(X509_set_issuer_name(cert.get(), name));
  CLEAVE_CHECK_SSL(X509_set_pubkey(cert.get(), key.get()));
  add_extension(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
  add_extension(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
  add_extension(cert.get(), cert.get(), NID_subject_key_identifier, "hash");
  CLEAVE_CHECK_SSL(X509_sign(cert.get(), key.get(), EVP_sha256()) > 0);

  write_file(out.key, pem_of_key(key.get()), 0600);
  write_file(out.cert, pem_of_cert(cert.get()), 0644);
  return out;
}

pem_paths issue_certificate(const fs::path& ca_dir, std::string_view name, const issue_options& opts,
                            const fs::path& out_dir) {
  if (!valid_node_name(name))
    throw core::error("invalid node name '" + std::string(name) +
                      "': use 1 to 64 of [A-Za-z0-9._-], starting with a letter or digit");
  if (opts.not_before.has_value() != opts.not_after.has_value())
    throw core::error("set both not_before and not_after, or neither");
  if (!opts.not_before && (opts.valid_days <= 0 || opts.valid_days > 36500))
    throw core::error("certificate validity must be 1 to 36500 days");
  const loaded_ca ca = load_ca(ca_dir);
  const fs::path dir = out_dir.empty() ? ca_dir : out_dir;
  ensure_dir(dir);
  const std::string base(name);
  const pem_paths out{dir / (base + ".crt"), dir / (base + ".key")};
  refuse_existing(out.cert, opts.overwrite, "certificate");
  refuse_existing(out.key, opts.overwrite, "key");

  auto key = new_ec_key();
  x509_ptr cert(X509_new());
  CLEAVE_CHECK_SSL(cert);
  CLEAVE_CHECK_SSL(X509_set_version(cert.get(), 2));
  set_serial(cert.get());
  const std::time_t now = std::time(nullptr);
  if (opts.not_before) {
    set_validity(cert.get(), std::chrono::system_clock::to_time_t(*opts.not_before),
                 std::chrono::system_clock::to_time_t(*opts.not_after));
  } else {
    set_validity(cert.get(), now - 60, now + static_cast<std::time_t>(opts.valid_days) * 86400);
  }
  X509_NAME* subject = X509_get_subject_name(cert.get());
  set_name(subject, "O", "cleave");
  set_name(subject, "OU", core::tier_name(opts.role));
  set_name(subject, "CN", name);
  if (opts.node_id) {
    if (*opts.node_id < 1 || *opts.node_id > max_node_id)
      throw core::error("node id " + std::to_string(*opts.node_id) + " out of range (1 to " +
                        std::to_string(max_node_id) + ")");
    set_name(subject, "serialNumber", std::to_string(*opts.node_id));
  }
  CLEAVE_CHECK_SSL(X509_set_issuer_name(cert.get(), X509_get_subject_name(ca.cert.get())));
  CLEAVE_CHECK_SSL(X509_set_pubkey(cert.get(), key.get()));

  add_extension(cert.get(), ca.cert.get(), NID_basic_constraints, "critical,CA:FALSE");
  add_extension(cert.get(), ca.cert.get(), NID_key_usage, "critical,digitalSignature");
  add_extension(cert.get(), ca.cert.get(), NID_ext_key_usage,
                opts.role == core::tier::device ? "clientAuth" : "serverAuth,clientAuth");
  add_extension(cert.get(), ca.cert.get(), NID_subject_key_identifier, "hash");
  add_extension(cert.get(), ca.cert.get(), NID_authority_key_identifier, "keyid:always");
  std::string san;
  const auto add_san = [&](const std::string& entry) {
    if (!san.empty()) san += ',';
    san += entry;
  };
  if (base.find('_') == std::string::npos) add_san("DNS:" + base);
  for (const auto& d : opts.dns_names) {
    if (d.empty() || d.find_first_of(",: ") != std::string::npos) throw core::error("invalid DNS name '" + d + "'");
    add_san("DNS:" + d);
  }
  for (const auto& ip : opts.ip_addresses) {
    if (ip.empty() || ip.find_first_of(", ") != std::string::npos) throw core::error("invalid IP address '" + ip + "'");
    add_san("IP:" + ip);
  }
  if (!san.empty()) add_extension(cert.get(), ca.cert.get(), NID_subject_alt_name, san);
  CLEAVE_CHECK_SSL(X509_sign(cert.get(), ca.key.get(), EVP_sha256()) > 0);

  write_file(out.key, pem_of_key(key.get()), 0600);
  write_file(out.cert, pem_of_cert(cert.get()), 0644);
  return out;
}

std::optional<std::uint32_t> node_id_of(std::string_view name, std::string_view serial_number) {
  std::string_view digits = serial_number;
  if (digits.empty()) {
    const auto dash = name.rfind('-');
    if (dash == std::string_view::npos || dash == 0) return std::nullopt;
    digits = name.substr(dash + 1);
  }
  if (digits.empty() || digits.size() > 6 || digits[0] == '0') return std::nullopt;
  std::uint32_t id = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    id = id * 10 + static_cast<std::uint32_t>(c - '0');
  }
  if (id < 1 || id > max_node_id) return std::nullopt;
  return id;
}

certificate_info read_certificate_info(const fs::path& path) {
  const auto cert = load_certificate(path, "certificate");
  certificate_info info;
  info.name = common_name(cert.get());
  info.role = certificate_role(cert.get());
  info.node_id = certificate_node_id(cert.get());
  if (const X509_NAME* issuer = X509_get_issuer_name(cert.get())) {
    const int i = X509_NAME_get_index_by_NID(issuer, NID_commonName, -1);
    if (i >= 0) {
      unsigned char* utf8 = nullptr;
      const int n = ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(issuer, i)));
      if (n >= 0) {
        info.issuer.assign(reinterpret_cast<const char*>(utf8), static_cast<std::size_t>(n));
        OPENSSL_free(utf8);
      }
    }
  }
  info.is_ca = X509_check_ca(cert.get()) > 0;
  info.not_before = asn1_time_point(X509_get0_notBefore(cert.get()));
  info.not_after = asn1_time_point(X509_get0_notAfter(cert.get()));
  ERR_clear_error();
  return info;
}

void check_node_files(const fs::path& ca_path, const fs::path& cert_path, const fs::path& key_path) {
  const auto ca = load_certificate(ca_path, "CA certificate");
  const auto cert = load_certificate(cert_path, "certificate");
  const auto key = load_private_key(key_path, "key");
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    throw core::error("key " + key_path.string() + " does not match certificate " + cert_path.string());
  }
  if (auto why = verify_against(cert.get(), ca.get()))
    throw core::error("certificate " + cert_path.string() + " does not verify against CA " + ca_path.string() + ": " +
                      *why);
}

}  // namespace cleave::transport
