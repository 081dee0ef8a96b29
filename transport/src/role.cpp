// Names of node roles, as written in certificates and on the command line.
#include "cleave/transport/role.h"

namespace cleave::transport {

std::string_view role_name(node_role r) {
  switch (r) {
    case node_role::server:
      return "server";
    case node_role::edge:
      return "edge";
    case node_role::device:
      return "device";
  }
  return "?";
}

std::optional<node_role> role_from_name(std::string_view name) {
  if (name == "server") return node_role::server;
  if (name == "edge") return node_role::edge;
  if (name == "device") return node_role::device;
  return std::nullopt;
}

}  // namespace cleave::transport
