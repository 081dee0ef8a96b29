// The tier of a node in a federation: GPU server, edge server (relay) or edge device. One enum
// for a node's role (written into its certificate, sent in its Hello) and the tier a block of a
// route runs on.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace cleave::core {

// Same numbers as cleave.wire.Role in the schema.
enum class tier : std::uint8_t { server = 0, edge = 1, device = 2 };

// "server", "edge", "device": as written in certificates and on the command line.
std::string_view tier_name(tier t);
std::optional<tier> tier_from_name(std::string_view name);

}  // namespace cleave::core
