// The role of a node in a federation: GPU server, edge server (relay) or edge device. A node's
// role is written into its certificate and travels in Hello messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace cleave::transport {

// Same numbers as cleave.wire.Role in the schema.
enum class node_role : std::uint8_t { server = 0, edge = 1, device = 2 };

std::string_view role_name(node_role r);
std::optional<node_role> role_from_name(std::string_view name);

}  // namespace cleave::transport
