// `cleave provision`: from a project file, the federation CA (created once, never re-minted), a
// key and certificate per node, and per node a startup kit (.tar.gz) with everything it needs to
// join: CA certificate, its certificate and key, the revocation list, a configuration for its
// command, a start script and a README.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "project_file.h"

namespace cleave::apps {

struct provision_options {
  // Only these nodes, which must be in the project and not provisioned yet; the CA must exist.
  // Empty: every node (the ones already provisioned keep their keys; their kits are rewritten).
  std::vector<std::string> add;
};

struct kit_report {
  std::string node;
  std::filesystem::path kit;  // empty when none was written
  bool new_certificate = false;
  std::string note;  // why no kit, or what was reused
};

struct provision_report {
  bool new_ca = false;
  std::string ca;  // what the CA is, for the output
  std::vector<kit_report> nodes;
};

// Checks everything first (the project, the CA, every existing certificate against its node),
// then writes; each file through a temporary one renamed into place. Throws core::error.
provision_report provision(const project& p, const provision_options& opts);

}  // namespace cleave::apps
