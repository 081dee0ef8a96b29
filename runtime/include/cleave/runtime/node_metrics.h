// The metrics every node exports (`--metrics ADDR`): one catalogue, so that a name means the
// same on the server, an edge and a device; each node sets those that apply to it. Base units
// (seconds, bytes), counters end in _total.
#pragma once

#include <utility>
#include <vector>

#include "cleave/core/tier.h"
#include "cleave/metrics/registry.h"
#include "cleave/transport/message.h"

namespace cleave::runtime {

void declare_node_metrics(metrics::registry& r);

// The block ranges a re-split moves off this node (segment_runner::rehost), counted and their
// bytes added before they are sent.
void count_migration(metrics::registry& r, const std::vector<std::pair<core::tier, transport::message_builder>>& moved);

}  // namespace cleave::runtime
