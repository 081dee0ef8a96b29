// The emulated links and slowdowns a schedule gives a node: what holds before round 1 and what a
// node that joins late is given.
#include <doctest/doctest.h>

#include "cleave/runtime/sessions.h"

using namespace cleave;

TEST_CASE("a link schedule's round 1 holds from the start, and a node that joins late gets the rounds it missed") {
  runtime::executors ex("device 1");
  runtime::link_schedule s(
      ex,
      transport::parse_schedule("at 1 link * edge-1 50Mbit/s 5ms; at 1 slowdown device-1 3; at 2 slowdown device-1 4;"
                                "at 3 link * edge-1 20Mbit/s 5ms; at 4 link * edge-1 10Mbit/s"),
      "device-1");
  // Before round 1 opens: joins and first profiles see round 1's link and slowdown.
  REQUIRE(s.caps_for("edge-1"));
  CHECK(s.caps_for("edge-1")->bytes_per_second == doctest::Approx(50e6 / 8));
  CHECK(s.caps_for("edge-1")->latency == std::chrono::milliseconds(5));
  CHECK_FALSE(s.caps_for("edge-2"));
  CHECK(s.start_slowdown(1.0) == 3.0);
  // Joining at round 3: rounds 1 to 3 in order, the latest link in force.
  const auto events = s.advance(3, {});
  REQUIRE(events.size() == 2);
  CHECK(events[0].slowdown == 3.0);
  CHECK(events[1].slowdown == 4.0);
  CHECK(s.caps_for("edge-1")->bytes_per_second == doctest::Approx(20e6 / 8));
  CHECK(s.advance(3, {}).empty());  // once per round
  CHECK(s.advance(2, {}).empty());
  s.advance(4, {});
  CHECK(s.caps_for("edge-1")->bytes_per_second == doctest::Approx(10e6 / 8));
  CHECK(s.caps_for("edge-1")->latency == std::chrono::microseconds(0));

  runtime::link_schedule none(ex, transport::parse_schedule(""), "device-1");
  CHECK_FALSE(none.caps_for("edge-1"));
  CHECK(none.start_slowdown(2.5) == 2.5);
}
