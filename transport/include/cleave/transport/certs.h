// Provisioning of a federation: its certificate authority, the key + certificate of each node
// (server, edge or device), renewal and revocation, written with OpenSSL 3's API. Backs
// `cleave certs init|issue|renew|revoke` and `cleave provision`.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cleave/core/tier.h"

namespace cleave::transport {

// File names inside a certificate directory.
inline constexpr std::string_view ca_cert_file = "ca.crt";
inline constexpr std::string_view ca_key_file = "ca.key";
// The CA's certificate revocation list (PEM), written by revoke_certificate.
inline constexpr std::string_view ca_crl_file = "ca.crl";

struct pem_paths {
  std::filesystem::path cert;
  std::filesystem::path key;
};

struct ca_options {
  std::string name = "cleave federation CA";
  int valid_days = 3650;
  bool overwrite = false;  // replace an existing CA (every node certificate must then be reissued)
};

// Creates `dir` if needed and writes ca.crt and ca.key (mode 0600): an EC P-256 key and a
// self-signed CA certificate (basicConstraints CA:TRUE pathlen:0, keyCertSign + cRLSign).
// Throws core::error when a CA already exists (unless overwrite) or a file cannot be written.
pem_paths init_ca(const std::filesystem::path& dir, const ca_options& opts = {});

struct issue_options {
  core::tier role = core::tier::device;
  int valid_days = 365;
  // Explicit validity window (both set or neither), e.g. to make an expired certificate in tests.
  std::optional<std::chrono::system_clock::time_point> not_before;
  std::optional<std::chrono::system_clock::time_point> not_after;
  std::vector<std::string> dns_names;     // subjectAltName DNS entries besides the node's name
  std::vector<std::string> ip_addresses;  // subjectAltName IP entries
  // The node id bound into the certificate (subject serialNumber); none: the one its name gives.
  std::optional<std::uint32_t> node_id;
  bool overwrite = false;
};

// The node id a certificate binds: its subject's serialNumber when present, else the number a
// name of the form WORD-N ends with ("device-12" -> 12); none when neither gives one in
// [1, max_node_id]. A device's Hello must claim this id.
inline constexpr std::uint32_t max_node_id = 999999;
std::optional<std::uint32_t> node_id_of(std::string_view name, std::string_view serial_number);

// Writes <out_dir>/<name>.crt and <name>.key (mode 0600), signed by the CA in `ca_dir`
// (out_dir defaults to ca_dir). Subject CN=<name> (the node's identity), OU=<role>, O=cleave;
// extended key usage serverAuth + clientAuth for servers and edges, clientAuth for devices.
// Throws core::error for a bad name, a missing or mismatched CA certificate and key, or an
// existing certificate (unless overwrite).
pem_paths issue_certificate(const std::filesystem::path& ca_dir, std::string_view name, const issue_options& opts,
                            const std::filesystem::path& out_dir = {});

// Names a node may take: 1 to 64 of [A-Za-z0-9._-], starting with a letter or digit.
bool valid_node_name(std::string_view name);

struct certificate_info {
  std::string name;    // subject CN
  std::string serial;  // serial number, upper-case hex
  std::optional<core::tier> role;
  std::optional<std::uint32_t> node_id;  // as node_id_of reads it
  std::string issuer;                    // issuer CN
  bool is_ca = false;
  std::chrono::system_clock::time_point not_before;
  std::chrono::system_clock::time_point not_after;
};
certificate_info read_certificate_info(const std::filesystem::path& cert);

// What a revocation list entry may say about why (RFC 5280 CRLReason, the ones that apply here).
enum class revocation_reason {
  unspecified,
  key_compromise,
  affiliation_changed,
  superseded,
  cessation_of_operation,
  privilege_withdrawn
};
// "key-compromise" <-> revocation_reason::key_compromise.
std::string_view revocation_reason_name(revocation_reason r);
std::optional<revocation_reason> revocation_reason_from_name(std::string_view name);

struct revoked_entry {
  std::string serial;  // upper-case hex
  std::chrono::system_clock::time_point when;
  revocation_reason reason = revocation_reason::unspecified;
};

struct revocation {
  std::string name;           // CN of the revoked certificate
  std::string serial;         // its serial, upper-case hex
  bool already = false;       // it was on the list before; the list is unchanged
  std::size_t n_revoked = 0;  // entries on the list now
  std::filesystem::path crl;
};

// Puts `cert` (a certificate the CA in `ca_dir` signed, expired or not) on <ca_dir>/ca.crl,
// creating the list or re-signing it with the CA key: version 2, a CRL number one above the
// last, valid until the CA certificate expires (so that a list nobody renews never locks every
// node out before the CA itself would). Written to a temporary file and renamed into place.
// Throws core::error for a certificate of another CA, a list that is not this CA's, or a file
// that cannot be written.
revocation revoke_certificate(const std::filesystem::path& ca_dir, const std::filesystem::path& cert,
                              revocation_reason reason = revocation_reason::unspecified);

// The entries of <ca_dir>/ca.crl (none when there is no list); throws core::error when the file
// is not a revocation list signed by the CA in `ca_dir`.
std::vector<revoked_entry> read_revocations(const std::filesystem::path& ca_dir);

struct renew_options {
  std::optional<int> valid_days;  // none: as long as the previous certificate was valid
  bool revoke_previous = false;   // put the previous certificate on the revocation list at once
};

struct renewal {
  pem_paths files;
  certificate_info previous, current;
  std::optional<revocation> revoked;  // when revoke_previous
};

// A new key and certificate for node `name` of the CA in `ca_dir`: same name, role, bound node id
// and subjectAltNames as its certificate there, a new serial and validity from now. The key is
// written before the certificate (each through a temporary file). Throws core::error when the node
// has no certificate in `ca_dir` or it was not issued by this CA.
renewal renew_certificate(const std::filesystem::path& ca_dir, std::string_view name, const renew_options& opts = {});

// Checks that `key` belongs to `cert` and that `cert` is signed by the CA certificate `ca` and
// valid now; throws core::error saying which file is wrong.
void check_node_files(const std::filesystem::path& ca, const std::filesystem::path& cert,
                      const std::filesystem::path& key);

}  // namespace cleave::transport
