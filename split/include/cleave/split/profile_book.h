// The adaptive splitter's book: the latest profile of every node and every link, turned into the
// cost model's problem over the devices now training (see splitter.h), and written to and read
// from a checkpoint's text fields so that a restarted server plans at once.
//
// A node's new profile replaces its previous one (the latest is kept, not the fastest seen): a
// device's reports rescale its profiled blocks by what its segments take under the plan in force,
// so a device that really became slower (a busier board, a schedule's `at N slowdown`) shows it in
// its next report; a minimum over a plan epoch would hide that until its next re-split. Noise at
// profiling time is taken out where it arises: profile_blocks keeps each block's fastest run.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cleave/core/model.h"
#include "cleave/core/tier.h"
#include "cleave/split/profiler.h"
#include "cleave/split/splitter.h"

namespace cleave::split {

struct node_key {
  core::tier role = core::tier::server;
  std::uint32_t id = 0;  // the server is 0
  friend auto operator<=>(const node_key&, const node_key&) = default;
};

class profile_book {
 public:
  // Step shape of every device: micro-batches of micro_batch samples, n_micro_batches per step.
  profile_book(const core::model_spec& m, int micro_batch, int n_micro_batches, bool u_shape);

  void set_profile(node_key node, node_profile p);
  bool has_profile(node_key node) const { return profiles_.count(node) > 0; }
  // One end's measurement of a link: its round trip and bandwidth (0: not measured yet).
  void report_link(node_key from, node_key to, double rtt_seconds, double bytes_per_second);
  struct link_measurement {
    node_key from, to;
    double rtt_seconds = 0, bytes_per_second = 0;
  };
  // Every link measured, in (from, to) order.
  std::vector<link_measurement> links() const;
  const std::map<node_key, node_profile>& profiles() const { return profiles_; }

  // The book as text fields under `prefix` (added to `meta`), figures written so that they read
  // back to the same bits:
  //   <prefix>profile:<role>:<id>:node_id, :batch, :backend, :memory_budget  one value each
  //   <prefix>profile:<role>:<id>:blocks  per block "forward_s backward_s param_bytes state_bytes
  //                                       saved_bytes output_bytes", blocks joined by "; "
  //   <prefix>profile:<role>:<id>:links   per link "peer_id rtt_us bytes_per_s", joined by "; "
  //   <prefix>link:<role>:<id>><role>:<id>  "rtt_seconds bytes_per_second" (from > to)
  void write(std::map<std::string, std::string>& meta, std::string_view prefix) const;
  // Replaces the book's profiles and links with those written under `prefix`. Throws core::error
  // naming the first malformed field (its key), the book then unchanged.
  void read(const std::map<std::string, std::string>& meta, std::string_view prefix);

  struct device_entry {
    std::uint32_t id = 0;
    std::uint32_t edge = 0;  // its edge's node id (0: connected to the server)
    bool behind_edge = false;
  };
  // The cost model's problem over these devices (in this order), or nullopt with `missing`
  // naming what it lacks first: a node's profile, or a link's bandwidth (neither end measured it
  // yet; a link is never priced as free).
  std::optional<split_problem> problem(const std::vector<device_entry>& devices, std::string& missing) const;

 private:
  node_costs costs_of(const node_profile& p) const;
  link_costs link_of(node_key a, node_key b) const;

  const core::model_spec* m_;
  int micro_batch_, n_micro_batches_;
  bool u_shape_;
  std::map<node_key, node_profile> profiles_;
  struct measurement {
    double rtt_seconds = 0, bytes_per_second = 0;
  };
  std::map<std::pair<node_key, node_key>, measurement> links_;  // (from, to)
};

}  // namespace cleave::split
