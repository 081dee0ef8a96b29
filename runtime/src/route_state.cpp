// Route state: reset at a join, announce a re-split, cut over at the device's step boundary.
#include "cleave/runtime/route_state.h"

#include <string>

#include "cleave/core/error.h"

namespace cleave::runtime {

void route_state::reset(split::route r, std::uint32_t e) {
  route = std::move(r);
  epoch = e;
  next.reset();
}

void route_state::announce(split::route r, std::uint32_t e) {
  if (e <= epoch)
    throw core::error("re-split to plan " + std::to_string(e) + ", not newer than " + std::to_string(epoch));
  next = std::move(r);
  next_epoch = e;
}

split::route route_state::cut_over(std::uint32_t e) {
  if (!next || e != next_epoch) throw core::error("Cutover to plan " + std::to_string(e) + ", which was not announced");
  split::route from = std::move(route);
  reset(std::move(*next), e);
  return from;
}

}  // namespace cleave::runtime
