// Provisioning of a federation: its certificate authority and the key + certificate of each node
// (server, edge or device), written with OpenSSL 3's API. Backs `cleave certs init|issue`.
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
  std::string name;  // subject CN
  std::optional<core::tier> role;
  std::optional<std::uint32_t> node_id;  // as node_id_of reads it
  std::string issuer;                    // issuer CN
  bool is_ca = false;
  std::chrono::system_clock::time_point not_before;
  std::chrono::system_clock::time_point not_after;
};
certificate_info read_certificate_info(const std::filesystem::path& cert);

// Checks that `key` belongs to `cert` and that `cert` is signed by the CA certificate `ca` and
// valid now; throws core::error saying which file is wrong.
void check_node_files(const std::filesystem::path& ca, const std::filesystem::path& cert,
                      const std::filesystem::path& key);

}  // namespace cleave::transport
