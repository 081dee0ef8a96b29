// The option tables of `cleave server`, `cleave edge` and `cleave agent`: each option once, bound
// to the typed field of the node's configuration it sets, its text parsed here at the boundary.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "cleave/device/agent.h"
#include "cleave/edge/edge_node.h"
#include "cleave/server/server_node.h"
#include "option_table.h"

namespace cleave::apps {

const option_table<server::server_config>& server_options();
const option_table<edge::edge_config>& edge_options();
const option_table<device::agent_config>& agent_options();

// The settings each command starts from before its options are read (a node's own defaults).
server::server_config default_server_config();
edge::edge_config default_edge_config();
device::agent_config default_agent_config();

// "host:port" -> parts; names the option in errors.
std::pair<std::string, std::uint16_t> host_port(const std::string& s, const char* option);
// "512M", "2G", "1048576" -> bytes; names the option in errors.
std::uint64_t parse_bytes(const std::string& s, const char* option);

}  // namespace cleave::apps
