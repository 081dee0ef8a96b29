// The project file of `cleave provision`: a federation's CA, directories and nodes in TOML, read
// strictly (every error names the file, the line and the key) and checked as a whole (names,
// ids, roles, addresses, who connects to whom) before anything is written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cleave/core/tier.h"

namespace cleave::apps {

// An option copied into a node's configuration: its key and its value as TOML text (checked).
struct config_entry {
  std::string key;
  std::string value;
  int line = 0;
};

struct node_spec {
  std::string name;
  core::tier role = core::tier::device;
  std::optional<std::uint32_t> id;    // devices: always set (given, or the N of NAME-N); edges: given
  std::string listen;                 // servers and edges: HOST:PORT they accept on
  std::string address;                // servers and edges: HOST:PORT the nodes below reach them at
  std::string upstream;               // edges and devices: the node they connect to
  std::vector<std::string> dns, ip;   // extra subjectAltNames
  std::optional<int> days;            // certificate validity (default: the project's)
  std::vector<config_entry> options;  // more options of its command
  int line = 0;                       // of its [[node]]
};

struct project {
  std::filesystem::path file;
  std::string name = "cleave";
  std::filesystem::path certs;  // the CA and every node's certificate (default: certs beside the file)
  std::filesystem::path kits;   // where kits are written (default: kits beside the file)
  int days = 365;               // node certificates
  int ca_days = 3650;
  // Options for every node of a command ([server], [edge], [agent]), before each node's own.
  std::map<core::tier, std::vector<config_entry>> defaults;
  std::vector<node_spec> nodes;

  const node_spec* find(const std::string& name) const;
};

// The command a node of this role runs: "server", "edge" or "agent".
const char* command_of(core::tier role);

// Whether `cleave COMMAND` has a long option `key` (checked for the options copied into configs).
using option_check = std::function<bool(const std::string& command, const std::string& key)>;

// Reads and checks a project file; throws core::error "FILE: line N: ..." (or "FILE: ..." for
// what concerns the whole project).
project read_project(const std::filesystem::path& file, const option_check& has_option);

}  // namespace cleave::apps
