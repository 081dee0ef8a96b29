// Emulated heterogeneity schedules: the text grammar and its units, wildcards, file input, the
// per-round per-node view, and errors that name the event and the problem.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "../support/error_of.h"
#include "cleave/transport/emulation.h"

using namespace cleave;
using namespace cleave::transport;
using namespace std::chrono_literals;
using kind = emulation_event::kind;

namespace {

std::string error_of(const std::string& text) {
  return testing::error_of([&] { parse_schedule(text); });
}

}  // namespace

TEST_CASE("a schedule parses links and slowdowns and sorts them by round, keeping the order within a round") {
  const auto s = parse_schedule(
      "at 3 link device-2 edge-1 10Mbit/s 40ms; at 2 slowdown device-1 4; at 5 link * edge-1 unlimited 0ms;"
      "at 2 link device-1 server-1 1Gbit/s");
  REQUIRE(s.events.size() == 4);
  CHECK_FALSE(s.empty());
  CHECK(s.events[0].round == 2);
  CHECK(s.events[0].what == kind::slowdown);
  CHECK(s.events[0].a == "device-1");
  CHECK(s.events[0].b.empty());
  CHECK(s.events[0].slowdown == 4.0);
  CHECK(s.events[1].round == 2);
  CHECK(s.events[1].what == kind::link);
  CHECK(s.events[1].caps.bytes_per_second == doctest::Approx(1.25e8));
  CHECK(s.events[1].caps.latency == 0us);
  CHECK(s.events[2].round == 3);
  CHECK(s.events[2].a == "device-2");
  CHECK(s.events[2].b == "edge-1");
  CHECK(s.events[2].caps.bytes_per_second == doctest::Approx(1.25e6));
  CHECK(s.events[2].caps.latency == 40ms);
  CHECK(s.events[3].round == 5);
  CHECK(s.events[3].a == "*");
  CHECK(s.events[3].caps.bytes_per_second == 0);
  CHECK_FALSE(s.events[3].caps.active());
}

TEST_CASE("bandwidth and latency units convert to bytes per second and microseconds") {
  const auto s = parse_schedule(
      "at 1 link a b 800bit/s 250us\n"
      "at 1 link a b 16kbit/s 1.5ms\n"
      "at 1 link a b 2.5 Mbit/s 2 s\n"
      "at 1 link a b 0.5Gbit/s\n"
      "at 1 link a b 8 KBIT/S 3 MS\n");
  REQUIRE(s.events.size() == 5);
  CHECK(s.events[0].caps.bytes_per_second == doctest::Approx(100));
  CHECK(s.events[0].caps.latency == 250us);
  CHECK(s.events[1].caps.bytes_per_second == doctest::Approx(2000));
  CHECK(s.events[1].caps.latency == 1500us);
  CHECK(s.events[2].caps.bytes_per_second == doctest::Approx(312500));
  CHECK(s.events[2].caps.latency == 2s);
  CHECK(s.events[3].caps.bytes_per_second == doctest::Approx(6.25e7));
  CHECK(s.events[3].caps.latency == 0us);
  CHECK(s.events[4].caps.bytes_per_second == doctest::Approx(1000));
  CHECK(s.events[4].caps.latency == 3ms);
}

TEST_CASE("blank events, newlines and comments are allowed, and an empty schedule is empty") {
  CHECK(parse_schedule("").empty());
  CHECK(parse_schedule(" ;; \n\n # nothing yet\n").empty());
  const auto s = parse_schedule("# a slow start\nat 2 slowdown d 2 ; ; # then fast again\n\n  at 4 slowdown d 1  \n");
  REQUIRE(s.events.size() == 2);
  CHECK(s.events[0].slowdown == 2.0);
  CHECK(s.events[1].round == 4);
  CHECK(s.events[1].slowdown == 1.0);
}

TEST_CASE("events describe themselves in one line") {
  const auto s = parse_schedule(
      "at 3 link device-2 edge-1 10Mbit/s 40ms; at 2 slowdown device-1 4; at 5 link * edge-1 unlimited;"
      "at 6 link a b 64kbit/s 500us; at 7 link a b 2Gbit/s 1.5s");
  REQUIRE(s.events.size() == 5);
  CHECK(s.events[0].str() == "round 2: slowdown device-1 x4");
  CHECK(s.events[1].str() == "round 3: link device-2 <-> edge-1: 10 Mbit/s, 40 ms");
  CHECK(s.events[2].str() == "round 5: link * <-> edge-1: unlimited, 0 ms");
  CHECK(s.events[3].str() == "round 6: link a <-> b: 64 kbit/s, 500 us");
  CHECK(s.events[4].str() == "round 7: link a <-> b: 2 Gbit/s, 1.5 s");
}

TEST_CASE("node names that are numbers are not taken for a bandwidth") {
  const auto s = parse_schedule("at 1 link 10 20 5 Mbit/s 3 ms");
  REQUIRE(s.events.size() == 1);
  CHECK(s.events[0].a == "10");
  CHECK(s.events[0].b == "20");
  CHECK(s.events[0].caps.bytes_per_second == doctest::Approx(625000));
  CHECK(s.events[0].caps.latency == 3ms);
}

TEST_CASE("names match a pattern when equal or when the pattern is the wildcard") {
  CHECK(name_matches("*", "edge-1"));
  CHECK(name_matches("edge-1", "edge-1"));
  CHECK_FALSE(name_matches("edge-1", "edge-2"));
  CHECK_FALSE(name_matches("edge", "edge-1"));
}

TEST_CASE("a node sees the events of a round that concern it, links turned towards it") {
  const auto s = parse_schedule(
      "at 3 link device-2 edge-1 10Mbit/s 40ms; at 3 slowdown device-1 4; at 3 link * edge-1 1Mbit/s;"
      "at 3 slowdown * 2; at 4 link device-2 server-1 5Mbit/s");

  const auto dev2 = s.at(3, "device-2");
  REQUIRE(dev2.size() == 3);
  CHECK(dev2[0].a == "device-2");
  CHECK(dev2[0].b == "edge-1");
  CHECK(dev2[0].caps.latency == 40ms);
  CHECK(dev2[1].a == "*");  // matched as the wildcard end
  CHECK(dev2[1].b == "edge-1");
  CHECK(dev2[2].what == kind::slowdown);
  CHECK(dev2[2].slowdown == 2.0);

  const auto edge = s.at(3, "edge-1");
  REQUIRE(edge.size() == 3);
  CHECK(edge[0].a == "edge-1");  // turned: edge-1 sends to device-2
  CHECK(edge[0].b == "device-2");
  CHECK(edge[1].a == "edge-1");  // edge-1 named exactly, the peer is anyone
  CHECK(edge[1].b == "*");
  CHECK(edge[1].caps.bytes_per_second == doctest::Approx(125000));
  CHECK(edge[2].what == kind::slowdown);

  const auto dev1 = s.at(3, "device-1");
  REQUIRE(dev1.size() == 3);
  CHECK(dev1[0].slowdown == 4.0);  // in the schedule's order
  CHECK(dev1[1].b == "edge-1");
  CHECK(dev1[2].slowdown == 2.0);

  CHECK(s.at(2, "device-2").empty());
  const auto later = s.at(4, "server-1");
  REQUIRE(later.size() == 1);
  CHECK(later[0].a == "server-1");
  CHECK(later[0].b == "device-2");
  CHECK(s.at(4, "edge-1").empty());
}

TEST_CASE("a schedule can be read from a file") {
  const auto path =
      std::filesystem::temp_directory_path() / ("cleave-test-schedule-" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream f(path);
    f << "# emulated links\nat 2 link device-1 edge-1 20Mbit/s 10ms\nat 1 slowdown device-1 3\n";
  }
  const auto s = parse_schedule(path.string());
  REQUIRE(s.events.size() == 2);
  CHECK(s.events[0].what == kind::slowdown);
  CHECK(s.events[1].caps.latency == 10ms);

  {
    std::ofstream f(path);
    f << "at 1 slowdown device-1 3\nat 2 slowdown device-1 half\n";
  }
  const std::string e = error_of(path.string());
  CHECK(e == "schedule event 'at 2 slowdown device-1 half' in '" + path.string() + "': factor 'half' is not a number");
  std::filesystem::remove(path);

  CHECK(error_of("no-such-schedule.txt") ==
        "schedule 'no-such-schedule.txt' is neither a file nor a schedule event ('at ROUND ...')");
}

TEST_CASE("a bad round is refused with the event and the reason") {
  CHECK(error_of("at x link device-2 edge-1 10Mbit/s") ==
        "schedule event 'at x link device-2 edge-1 10Mbit/s': round 'x' is not a number");
  CHECK(error_of("at 2.5 slowdown d 2") == "schedule event 'at 2.5 slowdown d 2': round '2.5' is not a number");
  CHECK(error_of("at 1 slowdown d 2; at 0 slowdown d 2") ==
        "schedule event 'at 0 slowdown d 2': round 0 is before the first round (rounds start at 1)");
  CHECK(error_of("at 99999999999 slowdown d 2").find("round '99999999999' is out of range") != std::string::npos);
}

TEST_CASE("a bad bandwidth or latency unit is refused with the unit") {
  CHECK(error_of("at 1 link a b 10Mbps") ==
        "schedule event 'at 1 link a b 10Mbps': bandwidth '10Mbps' has an unknown unit 'Mbps' "
        "(bit/s, kbit/s, Mbit/s or Gbit/s)");
  CHECK(error_of("at 1 link a b 10") ==
        "schedule event 'at 1 link a b 10': bandwidth '10' has no unit (bit/s, kbit/s, Mbit/s or Gbit/s)");
  CHECK(error_of("at 1 link a b fast").find("bandwidth 'fast' is not a number with a unit") != std::string::npos);
  CHECK(error_of("at 1 link a b 0Mbit/s").find("bandwidth '0Mbit/s' must be positive (or 'unlimited')") !=
        std::string::npos);
  CHECK(error_of("at 1 link a b 1Mbit/s 40min") ==
        "schedule event 'at 1 link a b 1Mbit/s 40min': latency '40min' has an unknown unit 'min' (us, ms or s)");
  CHECK(error_of("at 1 link a b 1Mbit/s -4ms").find("latency '-4ms' must be between 0 and an hour") !=
        std::string::npos);
}

TEST_CASE("events with missing or extra fields are refused with the expected form") {
  CHECK(error_of("at 3 link device-2 edge-1") ==
        "schedule event 'at 3 link device-2 edge-1': a link needs two node names and a bandwidth: "
        "'at ROUND link A B BANDWIDTH [LATENCY]'");
  CHECK(error_of("at 3 slowdown device-1") ==
        "schedule event 'at 3 slowdown device-1': a slowdown needs a node and a factor: "
        "'at ROUND slowdown NODE FACTOR'");
  CHECK(error_of("at 3").find("missing event kind") != std::string::npos);
  CHECK(error_of("at").find("missing round") != std::string::npos);
  CHECK(error_of("at 3 link a b 1Mbit/s 4ms extra").find("unexpected 'extra' after the latency") != std::string::npos);
  CHECK(error_of("at 3 slowdown d 2 3").find("unexpected '3' after the factor") != std::string::npos);
  CHECK(error_of("in 3 slowdown d 2") ==
        "schedule event 'in 3 slowdown d 2': an event starts with 'at ROUND', not 'in'");
  CHECK(error_of("at 3 link edge-1 edge-1 1Mbit/s").find("a link needs two different ends, not 'edge-1' twice") !=
        std::string::npos);
}

TEST_CASE("a slowdown below 1 is refused") {
  CHECK(error_of("at 2 slowdown device-1 0.5") ==
        "schedule event 'at 2 slowdown device-1 0.5': factor 0.5 is below 1 (a slowdown makes a node slower, never "
        "faster)");
  CHECK(error_of("at 2 slowdown device-1 inf").find("factor 'inf' is not a finite number") != std::string::npos);
}

TEST_CASE("an unknown event kind is refused with the kinds there are") {
  CHECK(error_of("at 2 partition device-1 edge-1") ==
        "schedule event 'at 2 partition device-1 edge-1': unknown event kind 'partition' (expected 'link' or "
        "'slowdown')");
}

// The emulated links and slowdowns a schedule gives a node: what holds before round 1 and what a
// node that joins late is given.
TEST_CASE("a link schedule's round 1 holds from the start, and a node that joins late gets the rounds it missed") {
  transport::link_schedule s(
      transport::parse_schedule("at 1 link * edge-1 50Mbit/s 5ms; at 1 slowdown device-1 3; at 2 slowdown device-1 4;"
                                "at 3 link * edge-1 20Mbit/s 5ms; at 4 link * edge-1 10Mbit/s"),
      "device-1", "device 1");
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

  transport::link_schedule none(transport::parse_schedule(""), "device-1", "device 1");
  CHECK_FALSE(none.caps_for("edge-1"));
  CHECK(none.start_slowdown(2.5) == 2.5);
}
