// What every node's configuration holds (server, edge, device agent): its certificates and name,
// its backend, its links, the emulated changes it applies by round, its metrics and memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "cleave/runtime/sessions.h"
#include "cleave/transport/emulation.h"

namespace cleave::runtime {

struct node_config {
  std::filesystem::path certs;  // directory written by `cleave certs`
  std::string name;             // this node's certificate name
  std::string backend = "auto";
  link_settings links;  // idle timeout of its channels, reconnection backoff cap
  // Emulated heterogeneity by round (transport/emulation.h): its links' caps, its slowdown.
  transport::emulation_schedule schedule;
  std::string metrics;              // "PORT" or "HOST:PORT" serving /metrics (Prometheus); "" = none
  std::string metrics_token;        // what every /metrics request carries (beyond loopback: needed)
  bool metrics_public = false;      // beyond loopback without a token, knowingly
  std::uint64_t memory_budget = 0;  // bytes its blocks may use (0: from the machine)
  // An agent or edge that stays up when the run ends: `cleave agent --stay` starts the node again
  // for the next job of a long-running server, until a stop signal.
  bool stay = false;
};

}  // namespace cleave::runtime
