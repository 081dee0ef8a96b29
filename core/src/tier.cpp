// Names of tiers, as written in certificates, logs and on the command line.
#include "cleave/core/tier.h"

namespace cleave::core {

std::string_view tier_name(tier t) {
  switch (t) {
    case tier::server:
      return "server";
    case tier::edge:
      return "edge";
    case tier::device:
      return "device";
    case tier::admin:
      return "admin";
  }
  return "?";
}

std::optional<tier> tier_from_name(std::string_view name) {
  for (tier t : {tier::server, tier::edge, tier::device})
    if (name == tier_name(t)) return t;
  return std::nullopt;
}

std::optional<tier> role_from_name(std::string_view name) {
  if (name == tier_name(tier::admin)) return tier::admin;
  return tier_from_name(name);
}

}  // namespace cleave::core
