// The metrics every node exports (`--metrics ADDR`): one catalogue, so that a name means the
// same on the server, an edge and a device; each node sets those that apply to it. Base units
// (seconds, bytes), counters end in _total.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cleave/core/tier.h"
#include "cleave/metrics/registry.h"
#include "cleave/transport/channel.h"
#include "cleave/transport/message.h"

namespace cleave::runtime {

void declare_node_metrics(metrics::registry& r);
// cleave_build_info = 1, its labels this build (what `cleave --version` prints).
void set_build_info(metrics::registry& r);

// The block ranges a re-split moves off this node (segment_runner::rehost), counted and their
// bytes added before they are sent.
void count_migration(metrics::registry& r, const std::vector<std::pair<core::tier, transport::message_builder>>& moved);

// One peer's link: up or not, its byte totals over all its connections (never lowered), and the
// figures of its open channel (`last`, when up).
void publish_link(metrics::registry& m, const std::string& peer, bool up, std::uint64_t sent, std::uint64_t received,
                  const transport::channel_stats& last);

}  // namespace cleave::runtime
