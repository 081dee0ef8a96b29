// The upload collector: parts checked and held until the final one, the secure-part rule, and
// the statistics of a round summed.
#include "cleave/runtime/upload_collector.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cleave/core/error.h"

namespace cleave::runtime {

void round_tally::add_loss(double loss, std::int64_t n, std::uint64_t correct) {
  loss_sum += loss * static_cast<double>(n);
  n_loss += static_cast<std::uint64_t>(n);
  n_correct += correct;
}

void round_tally::add(const protocol::round_stats& s, core::tier sender) {
  (sender == core::tier::edge ? edge_compute_s : device_compute_s) += static_cast<double>(s.compute_us) * 1e-6;
  device_compute_s += static_cast<double>(s.device_compute_us) * 1e-6;
  bytes_moved += s.bytes_moved;
  // The loss is counted where it was computed: by the receiver itself, or in these statistics.
  loss_sum += s.loss_sum;
  n_loss += s.n_loss;
  n_correct += s.n_correct;
}

protocol::round_stats round_tally::as_stats(double own_compute_s, std::uint64_t bytes) const {
  protocol::round_stats s;
  s.compute_us = static_cast<std::uint64_t>(own_compute_s * 1e6);
  s.device_compute_us = static_cast<std::uint64_t>(device_compute_s * 1e6 + 0.5);
  s.bytes_moved = bytes;
  s.loss_sum = loss_sum;
  s.n_loss = n_loss;
  s.n_correct = n_correct;
  return s;
}

void upload_collector::check_secure(core::tier from, const std::vector<std::uint32_t>& devices,
                                    const std::vector<split::route>& routes, const wire::ReplicaUpload& r) const {
  const int first = static_cast<int>(r.first_block()), end = static_cast<int>(r.end_block());
  if (from == core::tier::device) {
    // Its blocks come masked: this part is its statistics and samples only.
    if (first != end)
      throw core::error("blocks [" + std::to_string(first) + ", " + std::to_string(end) +
                        ") uploaded in the clear under secure aggregation");
    if (r.n_samples() > rules_.samples_per_device)
      throw core::error("claims " + std::to_string(r.n_samples()) + " samples; the round's steps allow " +
                        std::to_string(rules_.samples_per_device));
    return;
  }
  for (std::size_t i = 0; i < devices.size(); ++i)
    for (int seg : routes[i].segments_on(core::tier::device))
      if (first < routes[i].end(seg) && routes[i].begin(seg) < end)
        throw core::error("device " + std::to_string(devices[i]) +
                          "'s blocks uploaded in the clear under secure aggregation");
}

protocol::round_stats upload_collector::checked_stats(const void* sender, core::tier from,
                                                      const std::vector<std::uint32_t>& devices,
                                                      const std::vector<split::route>& routes,
                                                      const wire::ReplicaUpload& r) const {
  protocol::round_stats st = protocol::stats_of(r);
  const std::uint64_t n_devices = std::max<std::size_t>(devices.size(), 1);
  const std::uint64_t samples = rules_.samples_per_device * n_devices;
  if (st.n_correct > st.n_loss || st.n_loss > samples)
    throw core::error(
        fmt::format("statistics of {} losses, {} of them correct: {} device{} of this round allow {} "
                    "samples",
                    st.n_loss, st.n_correct, n_devices, n_devices == 1 ? "" : "s", samples));
  if (!std::isfinite(st.loss_sum) || st.loss_sum < 0 || st.loss_sum > loss_ceiling * static_cast<double>(st.n_loss))
    throw core::error(fmt::format("a loss sum of {:g} over {} samples is not a training loss (finite, 0 to {:g} each)",
                                  st.loss_sum, st.n_loss, loss_ceiling));
  // Compute at most the collection's wall time (and a second of rounding), per device behind it.
  const double wall = std::chrono::duration<double>(clock::now() - opened_).count() + 1.0;
  const auto bound = [](std::uint64_t us, double seconds) {
    return std::min<std::uint64_t>(us, static_cast<std::uint64_t>(seconds * 1e6));
  };
  st.compute_us = bound(st.compute_us, wall);
  st.device_compute_us =
      from == core::tier::device ? 0 : bound(st.device_compute_us, wall * static_cast<double>(n_devices));
  if (from != core::tier::device) return st;
  // A device's own upload: evidence that it trained in this collection.
  const std::uint32_t dev = devices.at(0);
  if (worked_.count(dev)) return st;
  if (!routes.at(0).device_only())
    throw core::error("none of its activations of this round reached this tier, yet it uploads its replica");
  if (rules_.unchanged && !rules_.secure && !changed_.count(sender))
    throw core::error("its replica is the one the round started from: it trained nothing");
  return st;
}

void upload_collector::add(const void* sender, core::tier from, const std::vector<std::uint32_t>& devices,
                           const std::vector<split::route>& routes, const wire::ReplicaUpload& r,
                           const protocol::weights_view& w) {
  try {
    if (rules_.secure) check_secure(from, devices, routes, r);
    if (!rules_.secure || from != core::tier::device) {
      if (from == core::tier::edge && devices.size() > 1 && rules_.per_device && r.first_block() < r.end_block())
        throw core::error("a pre-average of " + std::to_string(devices.size()) +
                          " devices, but the aggregation rule needs each device's own replicas");
      split::replica_rights rights;
      if (from == core::tier::device)
        rights = split::device_rights(routes.at(0), rules_.samples_per_device);
      else
        for (const auto& route : routes) split::add_relayed(rights, route, rules_.samples_per_device);
      ledger_.check(
          devices, rights,
          {static_cast<int>(r.first_block()), static_cast<int>(r.end_block()), r.n_samples(), w.params, w.buffers});
      if (rules_.unchanged && r.first_block() < r.end_block() &&
          !rules_.unchanged(static_cast<int>(r.first_block()), static_cast<int>(r.end_block()), w.params))
        changed_.insert(sender);
    }
    if (r.final_part()) stats_[sender] = checked_stats(sender, from, devices, routes, r);
  } catch (const core::error&) {
    drop(sender);
    throw;
  }
  if (r.first_block() < r.end_block())  // a part without blocks is statistics only
    held_[sender].push_back({devices,
                             static_cast<int>(r.first_block()),
                             static_cast<int>(r.end_block()),
                             static_cast<double>(r.n_samples()),
                             {w.params.begin(), w.params.end()},
                             {w.buffers.begin(), w.buffers.end()}});
}

std::vector<upload_part> upload_collector::complete(const void* sender, core::tier from,
                                                    const std::vector<std::uint32_t>& finished) {
  std::vector<upload_part> parts;
  if (const auto it = held_.find(sender); it != held_.end()) {
    parts = std::move(it->second);
    held_.erase(it);
  }
  // Statistics of a final part add() took (none when it was not offered: all its devices were
  // counted out).
  if (const auto st = stats_.find(sender); st != stats_.end()) {
    tally_.add(st->second, from);
    stats_.erase(st);
  }
  changed_.erase(sender);
  done_.insert(finished.begin(), finished.end());
  return parts;
}

void upload_collector::forget(std::uint32_t device) {
  ledger_.forget(device);
  done_.erase(device);
  worked_.erase(device);
}

}  // namespace cleave::runtime
