// Federation provisioning with OpenSSL 3: CA creation, node key + certificate issuance, renewal,
// revocation lists, checks.
#include "cleave/transport/certs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <set>

#include "cleave/core/atomic_file.h"
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

  core::write_file_atomically(out.key, pem_of_key(key.get()), 0600);
  core::write_file_atomically(out.cert, pem_of_cert(cert.get()), 0644);
  return out;
}

namespace {

// Another node's certificate of `role` in `dirs` that binds `id` and is not on the CA's
// revocation list ("" when there is none): two certificates for one id would let either holder
// act as the other.
std::string holder_of_id(const std::vector<fs::path>& dirs, const fs::path& ca_dir, core::tier role, std::uint32_t id,
                         std::string_view name) {
  std::set<std::string> revoked;
  for (const auto& r : read_revocations(ca_dir)) revoked.insert(r.serial);
  for (const auto& dir : dirs) {
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(dir, ec)) {
      if (f.path().extension() != ".crt" || f.path().filename() == ca_cert_file) continue;
      certificate_info info;
      try {
        info = read_certificate_info(f.path());
      } catch (const core::error&) {
        continue;  // not a certificate this check can read: not a holder either
      }
      if (info.name != name && info.role == role && info.node_id == id && !info.is_ca && !revoked.count(info.serial))
        return info.name + "' (" + f.path().string() + ")";
    }
  }
  return {};
}

}  // namespace

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
  if (const auto id = opts.node_id ? opts.node_id : node_id_of(name, "")) {
    std::vector<fs::path> dirs{ca_dir};
    if (dir != ca_dir) dirs.push_back(dir);
    if (const auto holder = holder_of_id(dirs, ca_dir, opts.role, *id, name); !holder.empty())
      throw core::error(std::string(core::tier_name(opts.role)) + " id " + std::to_string(*id) +
                        " is already bound to '" + holder +
                        ": revoke that certificate first (cleave certs revoke) or choose another id");
  }

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
  add_extension(
      cert.get(), ca.cert.get(), NID_ext_key_usage,
      opts.role == core::tier::device || opts.role == core::tier::admin ? "clientAuth" : "serverAuth,clientAuth");
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

  core::write_file_atomically(out.key, pem_of_key(key.get()), 0600);
  core::write_file_atomically(out.cert, pem_of_cert(cert.get()), 0644);
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
  info.serial = serial_hex(X509_get0_serialNumber(cert.get()));
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

namespace {

struct reason_code {
  revocation_reason reason;
  const char* name;
  int code;  // RFC 5280 CRLReason
};
constexpr reason_code reason_codes[] = {
    {revocation_reason::unspecified, "unspecified", 0},
    {revocation_reason::key_compromise, "key-compromise", 1},
    {revocation_reason::affiliation_changed, "affiliation-changed", 3},
    {revocation_reason::superseded, "superseded", 4},
    {revocation_reason::cessation_of_operation, "cessation-of-operation", 5},
    {revocation_reason::privilege_withdrawn, "privilege-withdrawn", 9},
};

revocation_reason reason_of(const X509_REVOKED* r) {
  int crit = 0;
  auto* e = static_cast<ASN1_ENUMERATED*>(X509_REVOKED_get_ext_d2i(r, NID_crl_reason, &crit, nullptr));
  if (!e) return revocation_reason::unspecified;
  const long code = ASN1_ENUMERATED_get(e);
  ASN1_ENUMERATED_free(e);
  for (const auto& c : reason_codes)
    if (c.code == code) return c.reason;
  return revocation_reason::unspecified;
}

// The revocation list in `dir`, checked against the CA certificate; none when there is no file.
x509_crl_ptr load_ca_crl(const fs::path& dir, X509* ca) {
  const fs::path path = dir / ca_crl_file;
  std::error_code ec;
  if (!fs::exists(path, ec)) return nullptr;
  auto crl = load_crl(path, "revocation list");
  if (auto why = crl_problem(crl.get(), ca))
    throw core::error("revocation list " + path.string() + " is not the CA's: " + *why);
  return crl;
}

std::size_t n_entries(X509_CRL* crl) {
  const STACK_OF(X509_REVOKED)* revs = crl ? X509_CRL_get_REVOKED(crl) : nullptr;
  return revs ? static_cast<std::size_t>(sk_X509_REVOKED_num(revs)) : 0;
}

// Adds `cert` to the CA's list (a new list when there is none), signs it and writes it.
revocation add_to_crl(const fs::path& dir, const loaded_ca& ca, X509* cert, revocation_reason reason) {
  revocation out;
  out.name = common_name(cert);
  out.serial = serial_hex(X509_get0_serialNumber(cert));
  out.crl = dir / ca_crl_file;
  const x509_crl_ptr old = load_ca_crl(dir, ca.cert.get());
  X509_REVOKED* listed = nullptr;
  if (old &&
      X509_CRL_get0_by_serial(old.get(), &listed, const_cast<ASN1_INTEGER*>(X509_get0_serialNumber(cert))) == 1) {
    out.already = true;
    out.n_revoked = n_entries(old.get());
    return out;
  }
  ERR_clear_error();

  x509_crl_ptr crl(X509_CRL_new());
  CLEAVE_CHECK_SSL(crl);
  CLEAVE_CHECK_SSL(X509_CRL_set_version(crl.get(), X509_CRL_VERSION_2));
  CLEAVE_CHECK_SSL(X509_CRL_set_issuer_name(crl.get(), X509_get_subject_name(ca.cert.get())));
  const std::time_t now = std::time(nullptr);
  // Backdated a minute as certificates are, for nodes whose clock is slightly behind.
  asn1_time_ptr last(ASN1_TIME_set(nullptr, now - 60));
  CLEAVE_CHECK_SSL(last);
  CLEAVE_CHECK_SSL(X509_CRL_set1_lastUpdate(crl.get(), last.get()));
  CLEAVE_CHECK_SSL(X509_CRL_set1_nextUpdate(crl.get(), X509_get0_notAfter(ca.cert.get())));
  if (old) {
    const STACK_OF(X509_REVOKED)* revs = X509_CRL_get_REVOKED(old.get());
    for (int i = 0; revs && i < sk_X509_REVOKED_num(revs); ++i) {
      x509_revoked_ptr copy(X509_REVOKED_dup(sk_X509_REVOKED_value(revs, i)));
      CLEAVE_CHECK_SSL(copy);
      CLEAVE_CHECK_SSL(X509_CRL_add0_revoked(crl.get(), copy.get()));
      copy.release();  // the list owns it now
    }
  }
  x509_revoked_ptr entry(X509_REVOKED_new());
  CLEAVE_CHECK_SSL(entry);
  CLEAVE_CHECK_SSL(X509_REVOKED_set_serialNumber(entry.get(), const_cast<ASN1_INTEGER*>(X509_get0_serialNumber(cert))));
  asn1_time_ptr when(ASN1_TIME_set(nullptr, now));
  CLEAVE_CHECK_SSL(when);
  CLEAVE_CHECK_SSL(X509_REVOKED_set_revocationDate(entry.get(), when.get()));
  if (reason != revocation_reason::unspecified) {  // RFC 5280: unspecified is left out
    std::unique_ptr<ASN1_ENUMERATED, ssl_deleter<ASN1_ENUMERATED_free>> code(ASN1_ENUMERATED_new());
    CLEAVE_CHECK_SSL(code);
    for (const auto& c : reason_codes)
      if (c.reason == reason) CLEAVE_CHECK_SSL(ASN1_ENUMERATED_set(code.get(), c.code));
    CLEAVE_CHECK_SSL(X509_REVOKED_add1_ext_i2d(entry.get(), NID_crl_reason, code.get(), 0, 0) == 1);
  }
  CLEAVE_CHECK_SSL(X509_CRL_add0_revoked(crl.get(), entry.get()));
  entry.release();

  // CRL number: one above the previous list's.
  bignum_ptr number(BN_new());
  CLEAVE_CHECK_SSL(number);
  if (old) {
    if (auto* n = static_cast<ASN1_INTEGER*>(X509_CRL_get_ext_d2i(old.get(), NID_crl_number, nullptr, nullptr))) {
      number.reset(ASN1_INTEGER_to_BN(n, nullptr));
      ASN1_INTEGER_free(n);
      CLEAVE_CHECK_SSL(number);
    }
  }
  CLEAVE_CHECK_SSL(BN_add_word(number.get(), 1));
  asn1_integer_ptr crl_number(BN_to_ASN1_INTEGER(number.get(), nullptr));
  CLEAVE_CHECK_SSL(crl_number);
  CLEAVE_CHECK_SSL(X509_CRL_add1_ext_i2d(crl.get(), NID_crl_number, crl_number.get(), 0, 0) == 1);
  CLEAVE_CHECK_SSL(X509_CRL_sort(crl.get()));
  CLEAVE_CHECK_SSL(X509_CRL_sign(crl.get(), ca.key.get(), EVP_sha256()) > 0);
  core::write_file_atomically(out.crl, pem_of_crl(crl.get()), 0644);
  out.n_revoked = n_entries(crl.get());
  return out;
}

void check_issued_by(X509* cert, X509* ca, const fs::path& cert_path, const fs::path& dir) {
  EVP_PKEY* pub = X509_get0_pubkey(ca);
  if (X509_check_issued(ca, cert) != X509_V_OK || !pub || X509_verify(cert, pub) != 1) {
    ERR_clear_error();
    throw core::error("certificate " + cert_path.string() + " was not issued by the CA in " + dir.string());
  }
}

// The DNS and IP subjectAltNames of `cert`, except DNS:<its name> (issue_certificate adds that).
void alt_names(X509* cert, std::vector<std::string>& dns, std::vector<std::string>& ips) {
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  const std::string self = common_name(cert);
  for (int i = 0; names && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
    if (n->type == GEN_DNS) {
      std::string d(reinterpret_cast<const char*>(ASN1_STRING_get0_data(n->d.dNSName)),
                    static_cast<std::size_t>(ASN1_STRING_length(n->d.dNSName)));
      if (d != self) dns.push_back(std::move(d));
    } else if (n->type == GEN_IPADD) {
      const int len = ASN1_STRING_length(n->d.iPAddress);
      char text[INET6_ADDRSTRLEN] = {};
      if ((len == 4 || len == 16) &&
          ::inet_ntop(len == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(n->d.iPAddress), text, sizeof text))
        ips.emplace_back(text);
    }
  }
  GENERAL_NAMES_free(names);
  ERR_clear_error();
}

}  // namespace

std::string_view revocation_reason_name(revocation_reason r) {
  for (const auto& c : reason_codes)
    if (c.reason == r) return c.name;
  return "unspecified";
}

std::optional<revocation_reason> revocation_reason_from_name(std::string_view name) {
  for (const auto& c : reason_codes)
    if (name == c.name) return c.reason;
  return std::nullopt;
}

revocation revoke_certificate(const fs::path& ca_dir, const fs::path& cert_path, revocation_reason reason) {
  const loaded_ca ca = load_ca(ca_dir);
  const auto cert = load_certificate(cert_path, "certificate");
  check_issued_by(cert.get(), ca.cert.get(), cert_path, ca_dir);
  return add_to_crl(ca_dir, ca, cert.get(), reason);
}

std::vector<revoked_entry> read_revocations(const fs::path& ca_dir) {
  const auto ca = load_certificate(ca_dir / ca_cert_file, "CA certificate");
  const auto crl = load_ca_crl(ca_dir, ca.get());
  std::vector<revoked_entry> out;
  const STACK_OF(X509_REVOKED)* revs = crl ? X509_CRL_get_REVOKED(crl.get()) : nullptr;
  for (int i = 0; revs && i < sk_X509_REVOKED_num(revs); ++i) {
    const X509_REVOKED* r = sk_X509_REVOKED_value(revs, i);
    out.push_back({serial_hex(X509_REVOKED_get0_serialNumber(r)), asn1_time_point(X509_REVOKED_get0_revocationDate(r)),
                   reason_of(r)});
  }
  return out;
}

renewal renew_certificate(const fs::path& ca_dir, std::string_view name, const renew_options& opts) {
  if (!valid_node_name(name)) throw core::error("invalid node name '" + std::string(name) + "'");
  const fs::path cert_path = ca_dir / (std::string(name) + ".crt");
  std::error_code ec;
  if (!fs::exists(cert_path, ec))
    throw core::error("no certificate of '" + std::string(name) + "' in " + ca_dir.string() +
                      " to renew (issue one with `cleave certs issue`)");
  const loaded_ca ca = load_ca(ca_dir);
  const auto old = load_certificate(cert_path, "certificate");
  check_issued_by(old.get(), ca.cert.get(), cert_path, ca_dir);
  renewal out;
  out.previous = read_certificate_info(cert_path);
  if (out.previous.name != name)
    throw core::error("certificate " + cert_path.string() + " is for '" + out.previous.name + "', not '" +
                      std::string(name) + "'");
  if (!out.previous.role) throw core::error("certificate " + cert_path.string() + " holds no role");

  issue_options io;
  io.role = *out.previous.role;
  if (opts.valid_days) {
    io.valid_days = *opts.valid_days;
  } else {
    const auto held =
        std::chrono::duration_cast<std::chrono::seconds>(out.previous.not_after - out.previous.not_before);
    io.valid_days = static_cast<int>(std::clamp<std::int64_t>(held.count() / 86400, 1, 36500));
  }
  if (const std::string bound = subject_entry(old.get(), NID_serialNumber); !bound.empty())
    io.node_id = node_id_of(name, bound);
  alt_names(old.get(), io.dns_names, io.ip_addresses);
  io.overwrite = true;
  out.files = issue_certificate(ca_dir, name, io);
  out.current = read_certificate_info(out.files.cert);
  if (opts.revoke_previous) out.revoked = add_to_crl(ca_dir, ca, old.get(), revocation_reason::superseded);
  return out;
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
