// Serves a registry over HTTP: GET /metrics in the Prometheus text format (everything else is
// 404), on its own thread (cpp-httplib), so that a scrape never waits on a node's I/O or compute.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cleave/metrics/registry.h"

namespace cleave::metrics {

// "PORT" (loopback), "HOST:PORT" or "[V6]:PORT" -> host and port; throws std::invalid_argument
// naming `what` (the option) when it is neither. Port 0 picks a free one.
std::pair<std::string, std::uint16_t> parse_listen_address(const std::string& text, const std::string& what);

class exporter {
 public:
  // Binds `address` (see parse_listen_address) and serves until destroyed; throws
  // std::runtime_error naming the address when it cannot bind.
  exporter(const registry& r, const std::string& address, const std::string& what = "--metrics");
  ~exporter();
  exporter(const exporter&) = delete;
  exporter& operator=(const exporter&) = delete;
  std::string host() const;
  std::uint16_t port() const;

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

}  // namespace cleave::metrics
