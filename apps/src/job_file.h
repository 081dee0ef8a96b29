// Job files: what one training run of a long-running server is (TOML, the server's per-run
// options by their names: model, rounds, local-steps, cuts, codecs, aggregate, dataset, ...),
// read as strictly as every configuration file.
#pragma once

#include <string>
#include <vector>

#include "cleave/server/server_node.h"

namespace cleave::apps {

// The server options a job file may set.
const std::vector<std::string>& job_keys();

// `base` (the server's own settings) with the job file's settings on top. Throws core::error
// naming the file, the line and the key of the first problem (a syntax error, an unknown key,
// a key the server sets for itself, a bad value).
server::server_config job_settings(const server::server_config& base, const std::string& text, const std::string& file);

}  // namespace cleave::apps
