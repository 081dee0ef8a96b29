// A federation in one process: the certificates of its nodes, and a server, optionally an edge,
// and device agents on threads of this process over loopback TLS, the way an app tries out a
// data source and a model before deploying its nodes on machines of their own.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "cleave/device/agent.h"
#include "cleave/edge/edge_node.h"
#include "cleave/server/server_node.h"

namespace cleave::federation {

// The federation CA (created when `certs` holds none) and the certificates of "server",
// "edge-1" .. "edge-<n_edges>" and "device-1" .. "device-<n_devices>" (each kept when present),
// in the layout `cleave certs` writes. Throws core::error.
void provision_local(const std::filesystem::path& certs, int n_devices, int n_edges = 1);

struct local_config {
  std::filesystem::path certs;  // written by provision_local (or `cleave certs`)
  // The server's settings (model, rounds, steps, optimizer, test data...); run_local sets its
  // certs, name ("server"), listening address (loopback, any free port) and on_listening.
  server::server_config server;
  // Devices connect through the edge "edge-1" when set (its certs, name, ports and upstream set
  // by run_local), else straight to the server.
  bool use_edge = true;
  edge::edge_config edge;
  // One per device: its data (`source` or `data`), shard, partition, backend... run_local sets
  // certs, name ("device-<id>"), upstream; an id of 0 becomes its position + 1.
  std::vector<device::agent_config> devices;
  double start_timeout_s = 30;  // for the server and the edge to listen
};

struct local_result {
  std::vector<server::round_report> rounds;  // every round the server closed, in order
  std::vector<float> global_params;          // the global model at the end (flat, all blocks)
};

// Runs every node until the server ends the run (the agents and the edge end with it); throws
// core::error with the first node that failed (the others are stopped).
local_result run_local(local_config c);

}  // namespace cleave::federation
