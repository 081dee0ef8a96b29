// A device's route as a node sees it: the plan in force and a re-split announced for the
// device's next step boundary. The same for agent, edge and server.
#pragma once

#include <cstdint>
#include <optional>

#include "cleave/split/plan.h"

namespace cleave::runtime {

struct route_state {
  split::route route;
  std::uint32_t epoch = 0;
  std::optional<split::route> next;  // announced, not cut over yet
  std::uint32_t next_epoch = 0;

  // A plan in force at once (a join); an announced re-split is dropped.
  void reset(split::route r, std::uint32_t e);
  // A re-split that takes effect at the device's next step boundary; throws unless e is newer.
  void announce(split::route r, std::uint32_t e);
  // The device cut over to plan e: the announced route is in force; returns the one it replaces.
  // Throws core::error when e was not announced.
  split::route cut_over(std::uint32_t e);
};

}  // namespace cleave::runtime
