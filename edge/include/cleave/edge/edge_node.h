// The middle tier: devices connect to an edge, the edge connects to the server. It runs the
// edge segments of its devices' routes, relays everything else, and pre-averages its devices'
// replicas with its own before sending one aggregate upstream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cleave/runtime/node_config.h"

namespace cleave::edge {

struct edge_config : runtime::node_config {
  edge_config() { name = "edge-1"; }
  std::uint32_t id = 1000;  // node id (distinct from device ids)
  std::string listen_host = "127.0.0.1";
  std::uint16_t port = 7100;
  std::vector<std::string> allowed;
  std::string upstream_host = "127.0.0.1";
  std::uint16_t upstream_port = 7000;
  std::string upstream_name = "server";
  int profile_every = 20;  // device steps between the profiles it sends upstream
  // Relays only masked device replicas (secure aggregation): a server whose plan does not
  // aggregate securely is refused, and so is a device uploading weights in the clear.
  bool secure_aggregation = false;
};

class edge_node {
 public:
  explicit edge_node(edge_config c);
  ~edge_node();
  edge_node(const edge_node&) = delete;
  edge_node& operator=(const edge_node&) = delete;

  // Serves until the server ends the run. Throws core::error on fatal configuration problems.
  int run();
  void stop();  // thread-safe
  // SIGINT and SIGTERM end run() cleanly; SIGHUP reloads the certificate, key, CA and revocation
  // list for new connections, closing those of peers now revoked (call before run()).
  void stop_on_signals();
  std::uint16_t port() const;  // after listening started

 private:
  class impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace cleave::edge
