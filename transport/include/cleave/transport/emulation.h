// Emulated heterogeneity: a schedule of what changes at which training round (a link's bandwidth
// and latency, a node's compute slowdown), written as text so runs and demos can script it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cleave/transport/net_emulator.h"

namespace cleave::transport {

class channel;

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

// What a schedule gives one node (`node_name`), by round: link caps go to the channels whose peer
// they name, those open at once and later ones as they connect; round 1's events are in force from
// the start, before round 1 opens. Events are logged as "`who`: event". One thread.
class link_schedule {
 public:
  link_schedule(emulation_schedule schedule, std::string node_name, std::string who);
  // An open channel and its peer's name.
  struct peer {
    std::string name;
    channel* ch = nullptr;
  };
  // The events of the rounds after the last one seen up to `round`, for this node: link caps are
  // set on the open channels they name and kept for later ones; the other events (slowdowns) are
  // returned, in order. A node that joins late still gets the earlier rounds' events.
  std::vector<emulation_event> advance(std::uint64_t round, const std::vector<peer>& open);
  // The caps in force on the link to `peer` (the last event naming it), if any.
  std::optional<link_caps> caps_for(const std::string& peer) const;
  // Sets on a new channel to `peer` the caps of its link that are in force.
  void apply(channel& ch, const std::string& peer) const;
  // The compute slowdown round 1 sets for this node, or `otherwise`.
  double start_slowdown(double otherwise) const;

 private:
  emulation_schedule schedule_;
  std::string name_, who_;
  std::uint64_t round_ = 0;  // the last round advanced to
};

}  // namespace cleave::transport
