// Plans: which tier runs which blocks for each device. A device's route is a path of tiers
// (device -> [edge ->] server, or in U-shape back down to the device) and the cuts between
// them; segment i runs blocks [cut(i-1), cut(i)) and the last segment computes the loss, except
// where the device holds every block (not in U-shape): it computes the loss itself, and nothing
// of a step crosses a cut.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cleave/core/model.h"
#include "cleave/core/tier.h"

namespace cleave::split {

struct route {
  std::vector<core::tier> path;  // D S | D E S | D S D | D E S E D
  std::vector<int> cuts;         // path.size() - 1 boundaries, non-decreasing, within [1, n_blocks]
  int n_blocks = 0;

  int n_segments() const { return static_cast<int>(path.size()); }
  int begin(int segment) const { return segment == 0 ? 0 : cuts[static_cast<std::size_t>(segment - 1)]; }
  int end(int segment) const {
    return segment + 1 == n_segments() ? n_blocks : cuts[static_cast<std::size_t>(segment)];
  }
  bool u_shape() const { return path.size() > 1 && path.back() == core::tier::device; }
  // Every block on the device, off the U: the device computes the loss (segment 0 does).
  bool device_only() const { return !u_shape() && !cuts.empty() && cuts.front() == n_blocks; }
  // The segment that computes the loss.
  int loss_segment() const { return device_only() ? 0 : n_segments() - 1; }
  bool has_edge() const;
  // Segments of this route on tier t, in order.
  std::vector<int> segments_on(core::tier t) const;
  // "device[0,4) edge[4,7) server[7,12)"
  std::string str() const;

  friend bool operator==(const route&, const route&) = default;
};

// Builds and validates a route from its shape and cuts. Throws core::error naming the problem:
// cuts out of order or range, a device holding no block (its raw inputs would leave it), or
// in U-shape a device top that holds no block (its labels would leave it).
route make_route(bool u_shape, bool with_edge, const std::vector<int>& cuts, int n_blocks);

// The route that route::str() wrote ("device[0,4) edge[4,7) server[7,12)") over a model of
// n_blocks blocks; throws core::error naming the text and what is wrong with it (an unknown
// tier, a gap, a shape make_route does not build, a route of another model).
route parse_route(const std::string& text, int n_blocks);

// The tier that runs block `block` under route r; throws core::error outside [0, n_blocks).
core::tier tier_of_block(const route& r, int block);

// Every block at least `min_holders` of `routes` keep on the device, as sorted, merged [begin,
// end) ranges.
std::vector<std::pair<int, int>> device_blocks(const std::vector<route>& routes, int min_holders = 1);
// "[0,4) [9,12)"
std::string ranges_text(const std::vector<std::pair<int, int>>& ranges);

// "3" / "3,7" / "2,6,9" -> cuts; throws naming the text.
std::vector<int> parse_cuts(const std::string& text);
// The text parse_cuts reads: "3,7" ("" for no cuts).
std::string cuts_text(const std::vector<int>& cuts);

// Cuts used when none are configured: each boundary at the smallest activation within its share
// of the chain (small activations are cheap to send), the U-shape top on the device.
std::vector<int> default_cuts(const core::model_spec& m, bool u_shape, bool with_edge);
// A device's route with the configured cuts (none: default_cuts); throws core::error naming them.
route configured_route(const core::model_spec& m, bool u_shape, bool with_edge, const std::vector<int>& cuts);

struct plan {
  std::uint32_t epoch = 0;
  std::map<std::uint32_t, route> devices;  // device id -> its route
};

}  // namespace cleave::split
