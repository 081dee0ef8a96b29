// Emulated heterogeneity: a schedule of what changes at which training round (a link's bandwidth
// and latency, a node's compute slowdown), written as text so runs and demos can script it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cleave/transport/net_emulator.h"

namespace cleave::transport {

// Text grammar (events separated by ';' or newlines; blank events and '#' comments to the end
// of a line are allowed):
//   at ROUND link A B BANDWIDTH [LATENCY]   A, B: node names, '*' for any; the link is symmetric
//   at ROUND slowdown NODE FACTOR           FACTOR >= 1 (compute takes FACTOR times as long)
// ROUND >= 1. BANDWIDTH: a number with bit/s, kbit/s, Mbit/s or Gbit/s (decimal: 1e3, 1e6, 1e9
// bits), or `unlimited`. LATENCY (one-way, added per direction; 0 when left out): a number with
// us, ms or s. A number and its unit may be written apart ("10 Mbit/s").
struct emulation_event {
  int round = 1;
  enum class kind : std::uint8_t { link, slowdown } what = kind::link;
  std::string a, b;     // link ends (b empty for a slowdown, whose node is a)
  link_caps caps;       // link: bandwidth in bytes/s (0 unlimited) and latency
  double slowdown = 1;  // slowdown
  // "round 3: link device-2 <-> edge-1: 10 Mbit/s, 40 ms", "round 2: slowdown device-1 x4"
  std::string str() const;
};

struct emulation_schedule {
  std::vector<emulation_event> events;  // sorted by round (stable: same-round events keep their order)
  std::string text;                     // what it was parsed from (a file's contents): parse_schedule reads it back

  // Events of `round` that concern node `name`: links with `name` at one end, turned so that `a`
  // is that end and `b` the peer pattern (the caps then describe name's sending direction to b),
  // and slowdowns of `name`.
  std::vector<emulation_event> at(int round, std::string_view name) const;
  bool empty() const { return events.empty(); }
};

// Parses schedule text, or when the argument names an existing file, that file's contents.
// Errors name the event (its text) and the problem:
// "schedule event 'at x link ...': round 'x' is not a number".
emulation_schedule parse_schedule(const std::string& text_or_path);

// Whether `name` matches a pattern: "*" matches any name, anything else only itself.
bool name_matches(std::string_view pattern, std::string_view name);

}  // namespace cleave::transport
