// The route state every node keeps per device: a join, a re-split announced, the cutover, and the
// messages that are refused (an old plan, a cutover nobody announced).
#include <doctest/doctest.h>

#include "../support/error_of.h"
#include "cleave/runtime/route_state.h"

using namespace cleave;
using cleave::testing::error_of;

TEST_CASE("a route state switches to an announced re-split only at its cutover") {
  const auto a = split::make_route(false, false, {3}, 6), b = split::make_route(false, false, {5}, 6);
  runtime::route_state rs;
  rs.reset(a, 2);
  rs.announce(b, 4);
  CHECK(rs.route == a);  // still in force until the device cuts over
  CHECK(rs.epoch == 2);
  CHECK(error_of([&] { rs.cut_over(3); }) == "Cutover to plan 3, which was not announced");
  CHECK(rs.cut_over(4) == a);
  CHECK(rs.route == b);
  CHECK(rs.epoch == 4);
  CHECK(!rs.next);
  CHECK(error_of([&] { rs.cut_over(4); }) == "Cutover to plan 4, which was not announced");
}

TEST_CASE("a route state refuses a re-split that is not newer, and a join drops an announced one") {
  const auto a = split::make_route(false, false, {3}, 6), b = split::make_route(false, false, {5}, 6);
  runtime::route_state rs;
  rs.reset(a, 5);
  CHECK(error_of([&] { rs.announce(b, 5); }) == "re-split to plan 5, not newer than 5");
  rs.announce(b, 6);
  rs.reset(a, 7);
  CHECK(!rs.next);
  CHECK(rs.epoch == 7);
}
