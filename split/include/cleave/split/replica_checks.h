// What a node accepts of a round's replica uploads, before anything is averaged: each part lies
// in what the sender's plan gives it, no block comes twice for a device, every value is finite,
// and the samples are what the sender's steps allow. The same for server and edge.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cleave/split/plan.h"

namespace cleave::split {

// The first non-finite value of v, as "<what> 17 (nan)"; "" when all are finite.
std::string first_non_finite(std::span<const float> v, const char* what);

// What one sender may upload in a round.
struct replica_rights {
  // A device (exact): a part is exactly one of its own segments, the route in force now. An edge:
  // a part lies within the blocks the routes of the devices it names place on the edge and below
  // (its pre-average can merge device and edge blocks into one run).
  bool exact = true;
  std::vector<std::pair<int, int>> ranges;
  std::uint64_t max_samples = 0;  // what the named devices' steps allow, summed
  std::string holds;              // the routes, for messages
};
// A device uploading its own replicas under route r; its steps allow max_samples.
replica_rights device_rights(const route& r, std::uint64_t max_samples);
// An edge's upload for devices: call once per device named, with its route.
void add_relayed(replica_rights& rights, const route& r, std::uint64_t max_samples);

// One part of an upload as it came: blocks [first, end), the samples it claims, its values
// (the blocks' flat parameter and state slices).
struct replica_part {
  int first = 0, end = 0;
  std::uint64_t n_samples = 0;
  std::span<const float> params, buffers;
};

// The blocks a round's uploads covered, per device.
class replica_ledger {
 public:
  void clear() { covered_.clear(); }
  // A device starting afresh (it joined again): what it sent before does not count.
  void forget(std::uint32_t device) { covered_.erase(device); }
  // Checks a part uploaded for `devices` under `rights`; records its blocks for each of them when
  // it passes, else throws core::error saying what is wrong. A part without blocks (an edge's
  // statistics only) passes an edge's rights whatever samples it claims.
  void check(std::span<const std::uint32_t> devices, const replica_rights& rights, const replica_part& part);

 private:
  std::map<std::uint32_t, std::vector<std::pair<int, int>>> covered_;
};

}  // namespace cleave::split
