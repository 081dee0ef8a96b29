// The tier of a node in a federation: GPU server, edge server (relay) or edge device. One enum
// for a node's role (written into its certificate, sent in its Hello) and the tier a block of a
// route runs on.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace cleave::core {

// Same numbers as cleave.wire.Role in the schema.
// admin: an operator's certificate (`cleave job`), never a tier that blocks run on.
enum class tier : std::uint8_t { server = 0, edge = 1, device = 2, admin = 3 };

// "server", "edge", "device", "admin": as written in certificates and on the command line.
std::string_view tier_name(tier t);
// A tier blocks run on: server, edge or device.
std::optional<tier> tier_from_name(std::string_view name);
// A certificate's role: a tier or admin.
std::optional<tier> role_from_name(std::string_view name);

}  // namespace cleave::core
