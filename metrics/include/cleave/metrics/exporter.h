// A node's HTTP endpoints, each on its own thread (cpp-httplib), so that a request never waits on
// a node's I/O or compute: the Prometheus exporter (GET /metrics, /healthz, /readyz) and the
// pages a node serves beside it (the server's dashboard). Everything not served is 404.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cleave/metrics/registry.h"

namespace cleave::metrics {

// "PORT" (loopback), "HOST:PORT" or "[V6]:PORT" -> host and port; throws std::invalid_argument
// naming `what` (the option) when it is neither. Port 0 picks a free one.
std::pair<std::string, std::uint16_t> parse_listen_address(const std::string& text, const std::string& what);

// 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_host(const std::string& host);

// One GET path and what it answers with (made when asked, on the server's thread): `body` with
// status 200, or where `answer` is set, its status and body.
struct page {
  std::string path;
  std::string content_type;
  std::function<std::string()> body;
  std::function<std::pair<int, std::string>()> answer = {};
};

struct http_options {
  std::string what = "--metrics";  // the option that asked for it, for errors
  // When not empty, every request must carry it: "Authorization: Bearer TOKEN" or "?token=TOKEN"
  // (a browser opening the address); others get 401.
  std::string token;
  // Listening beyond loopback without a token is refused (what can be seen there is private).
  bool token_beyond_loopback = false;
};

class http_server {
 public:
  // Binds `address` (see parse_listen_address) and serves `pages` until destroyed; throws
  // std::invalid_argument for a bad address (or a missing token, see http_options) and
  // std::runtime_error naming the address when it cannot bind.
  http_server(const std::string& address, std::vector<page> pages, http_options o = {});
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;
  std::string host() const;
  std::uint16_t port() const;

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

// GET /metrics: the registry in the Prometheus text format; GET /healthz: 200 while the process
// serves; GET /readyz: 200 "ready", or 503 and the reason `not_ready` gives (empty: ready; not
// set: always ready), for a load balancer or a unit's watchdog.
class exporter {
 public:
  exporter(const registry& r, const std::string& address, const std::string& what = "--metrics",
           std::function<std::string()> not_ready = {});
  std::string host() const { return http_.host(); }
  std::uint16_t port() const { return http_.port(); }

 private:
  http_server http_;
};

}  // namespace cleave::metrics
