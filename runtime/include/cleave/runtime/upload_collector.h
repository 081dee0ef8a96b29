// A collection of replica uploads as the tier above their senders receives it (the server from
// devices and edges, an edge from its devices), and the one place a round's statistics are summed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cleave/core/tier.h"
#include "cleave/protocol/protocol.h"
#include "cleave/split/replica_checks.h"

namespace cleave::runtime {

// A SplitFed round's pace of signs of life, for a round (or a turn) of `deadline`: a device at
// work shows its round's work at least every progress_every, and the tier above counts out a
// member it hears nothing of for silence_allowed.
inline std::chrono::steady_clock::duration progress_every(std::chrono::steady_clock::duration deadline) {
  return std::max<std::chrono::steady_clock::duration>(std::chrono::seconds(1), deadline / 8);
}
inline std::chrono::steady_clock::duration silence_allowed(std::chrono::steady_clock::duration deadline) {
  return std::max<std::chrono::steady_clock::duration>(std::chrono::seconds(10), deadline / 4);
}

// What a round's work adds up to: compute per tier, bytes moved below the server, the training
// loss and accuracy over the samples whose loss was computed. Every node sums into one of these.
struct round_tally {
  double device_compute_s = 0, edge_compute_s = 0;
  std::uint64_t bytes_moved = 0;
  double loss_sum = 0;
  std::uint64_t n_loss = 0, n_correct = 0;

  // n samples whose mean loss is `loss`, `correct` of them classified right.
  void add_loss(double loss, std::int64_t n, std::uint64_t correct);
  // The statistics an upload from a node of tier `sender` carries.
  void add(const protocol::round_stats& s, core::tier sender);
  double mean_loss() const { return n_loss ? loss_sum / static_cast<double>(n_loss) : 0.0; }
  double accuracy() const { return n_loss ? static_cast<double>(n_correct) / static_cast<double>(n_loss) : 0.0; }
  // As an upload carries it up: with the sender's own compute and, from an edge, the bytes moved
  // on its device channels.
  protocol::round_stats as_stats(double own_compute_s, std::uint64_t bytes) const;
};

// A part of an upload that passed the checks: blocks [first, end) of `devices`, weighted by the
// samples behind it. A part without blocks carries statistics only.
struct upload_part {
  std::vector<std::uint32_t> devices;
  int first = 0, end = 0;
  double weight = 0;
  std::vector<float> params = {}, buffers = {};
};

// The uploads of one collection (a round, a sequential turn): each sender's parts are checked
// against what its devices' routes and the round's samples allow (a device block in the clear is
// refused under secure aggregation), held until the sender's final part, and then handed over
// whole; one bad part refuses them all. Senders are told apart by an opaque key (their session).
//
// A peer's word is not taken for its statistics: the final part's counts must be possible
// (correct <= losses <= the round's samples of its devices), its loss sum finite, non-negative
// and below loss_ceiling per sample; its compute is counted at most the collection's wall time
// (per device behind it). A device uploading for itself is done only on evidence of its work:
// activations of this collection reached this tier (saw()), or, training alone, its replica is
// not the one the collection started from (rules::unchanged).
class upload_collector {
 public:
  using clock = std::chrono::steady_clock;
  // Nats per sample: the true class's probability below e^-10000 is no figure of a model that
  // trains, but a lie or a divergence.
  static constexpr double loss_ceiling = 1e4;
  struct rules {
    std::uint64_t samples_per_device = 0;  // local steps x batch: what one device's steps allow
    bool secure = false;      // device blocks come masked: a device sends statistics, an edge its own blocks
    bool per_device = false;  // the aggregation rule needs each device's own replicas (no pre-average)
    // Whether the parameters of blocks [first, end) are those the collection started from
    // (empty: not known here).
    std::function<bool(int first, int end, std::span<const float> params)> unchanged = {};
  };
  upload_collector() = default;
  explicit upload_collector(rules r, clock::time_point opened = clock::now()) : rules_(std::move(r)), opened_(opened) {}

  // This tier received an activation of `device` belonging to this collection.
  void saw(std::uint32_t device) { worked_.insert(device); }

  // Checks a part from `sender` (a node of tier `from`) for `devices`, each on the route in force
  // now (`routes`, in the same order), and holds it. Throws core::error saying what is wrong; the
  // sender's held parts are dropped then.
  void add(const void* sender, core::tier from, const std::vector<std::uint32_t>& devices,
           const std::vector<split::route>& routes, const wire::ReplicaUpload& r, const protocol::weights_view& w);
  // After the sender's final part: its statistics (as add() checked them) are summed,
  // `finished` (the devices whose work it completes) are done, and its held parts are returned.
  std::vector<upload_part> complete(const void* sender, core::tier from, const std::vector<std::uint32_t>& finished);
  // The sender's channel closed: what it held goes.
  void drop(const void* sender) {
    held_.erase(sender);
    stats_.erase(sender);
    changed_.erase(sender);
  }
  // A device that starts afresh (it joined again): what it sent and did does not count.
  void forget(std::uint32_t device);

  const std::set<std::uint32_t>& done() const { return done_; }
  bool is_done(std::uint32_t device) const { return done_.count(device) > 0; }
  round_tally& tally() { return tally_; }
  const round_tally& tally() const { return tally_; }

 private:
  void check_secure(core::tier from, const std::vector<std::uint32_t>& devices, const std::vector<split::route>& routes,
                    const wire::ReplicaUpload& r) const;
  // The final part's statistics, checked and bounded; a device's evidence of work.
  protocol::round_stats checked_stats(const void* sender, core::tier from, const std::vector<std::uint32_t>& devices,
                                      const std::vector<split::route>& routes, const wire::ReplicaUpload& r) const;

  rules rules_;
  clock::time_point opened_ = clock::now();
  split::replica_ledger ledger_;
  std::map<const void*, std::vector<upload_part>> held_;
  std::map<const void*, protocol::round_stats> stats_;  // of final parts taken, until complete()
  std::set<const void*> changed_;                       // senders with a block part unlike the start
  std::set<std::uint32_t> worked_;                      // devices whose activations reached this tier
  std::set<std::uint32_t> done_;
  round_tally tally_;
};

}  // namespace cleave::runtime
