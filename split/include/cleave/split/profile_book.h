// The adaptive splitter's book: the latest profile of every node and every link, turned into the
// cost model's problem over the devices now training (see splitter.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
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

  struct device_entry {
    std::uint32_t id = 0;
    std::uint32_t edge = 0;  // its edge's node id (0: connected to the server)
    bool behind_edge = false;
  };
  // The cost model's problem over these devices (in this order), or nullopt with `missing`
  // naming the first node without a profile.
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
