// The metrics every node exports (`--metrics ADDR`): one catalogue, so that a name means the
// same on the server, an edge and a device; each node sets those that apply to it. Base units
// (seconds, bytes), counters end in _total.
#pragma once

#include "cleave/metrics/registry.h"

namespace cleave::runtime {

void declare_node_metrics(metrics::registry& r);

}  // namespace cleave::runtime
