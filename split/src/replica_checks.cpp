// Replica checks: plan ranges, blocks once per device and round, finite values, sample counts.
#include "cleave/split/replica_checks.h"

#include <algorithm>
#include <cmath>

#include "cleave/core/error.h"

namespace cleave::split {

namespace {

std::string range_str(int first, int end) {
  return "[" + std::to_string(first) + "," + std::to_string(end) + ")";
}

}  // namespace

std::string first_non_finite(std::span<const float> v, const char* what) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) return std::string(what) + " " + std::to_string(i) + " (" + std::to_string(v[i]) + ")";
  return "";
}

replica_rights device_rights(const route& r, std::uint64_t max_samples) {
  replica_rights out;
  out.exact = true;
  for (int s : r.segments_on(core::tier::device)) out.ranges.emplace_back(r.begin(s), r.end(s));
  out.max_samples = max_samples;
  out.holds = "route " + r.str();
  return out;
}

void add_relayed(replica_rights& rights, const route& r, std::uint64_t max_samples) {
  rights.exact = false;
  for (core::tier t : {core::tier::device, core::tier::edge})
    for (int s : r.segments_on(t))
      if (r.begin(s) < r.end(s)) rights.ranges.emplace_back(r.begin(s), r.end(s));
  rights.max_samples += max_samples;
  rights.holds += (rights.holds.empty() ? "routes " : ", ") + r.str();
}

void replica_ledger::check(std::span<const std::uint32_t> devices, const replica_rights& rights,
                           const replica_part& part) {
  const std::string blocks = "blocks " + range_str(part.first, part.end);
  const bool empty = part.first >= part.end;
  if (rights.exact) {
    const bool own =
        std::find(rights.ranges.begin(), rights.ranges.end(), std::pair{part.first, part.end}) != rights.ranges.end();
    if (!own) throw core::error(blocks + " are not one of its segments on " + rights.holds);
  } else if (!empty) {
    for (int b = part.first; b < part.end; ++b)
      if (std::none_of(rights.ranges.begin(), rights.ranges.end(),
                       [b](const auto& r) { return r.first <= b && b < r.second; }))
        throw core::error(blocks + " reach block " + std::to_string(b) +
                          ", which none of its devices holds on the edge or below (" + rights.holds + ")");
  }
  if (rights.exact || !empty) {
    if (part.n_samples == 0) throw core::error(blocks + " claim 0 samples");
    if (part.n_samples > rights.max_samples)
      throw core::error(blocks + " claim " + std::to_string(part.n_samples) + " samples; the round's steps allow " +
                        std::to_string(rights.max_samples));
  }
  for (auto d : devices)
    for (const auto& [f, e] : covered_[d])
      if (f < part.end && part.first < e)
        throw core::error(blocks + " of device " + std::to_string(d) + " overlap " + range_str(f, e) +
                          ", uploaded before in this round");
  for (const auto& bad : {first_non_finite(part.params, "parameter"), first_non_finite(part.buffers, "state value")})
    if (!bad.empty()) throw core::error(blocks + " hold a non-finite value: " + bad);
  if (empty) return;
  for (auto d : devices) covered_[d].emplace_back(part.first, part.end);
}

}  // namespace cleave::split
