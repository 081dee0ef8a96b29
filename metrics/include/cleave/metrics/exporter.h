// A node's HTTP endpoints, each on its own thread, so that a request never waits on a node's
// I/O or compute: the Prometheus exporter (GET /metrics, /healthz, /readyz) and the pages a node
// serves beside it (the server's dashboard). Everything not served is 404.
//
// Built to hold against peers that stall it: a request's whole head (request line and headers)
// must arrive within a deadline (5 s), and its answer leave within another; connections are
// capped per port and per address (beyond them a peer gets 503 at once), so that a flood cannot
// take the descriptors the node's TLS listener needs; the token is checked as soon as the head
// has arrived, before any page is made. Beyond loopback a port serves only with a token of at
// least 16 characters, or, for metrics, when explicitly public.
#pragma once

#include <chrono>
#include <cstddef>
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
// status 200, or where `answer` is set, its status and body. An `open` page is served without the
// token (health checks of a load balancer).
struct page {
  std::string path;
  std::string content_type;
  std::function<std::string()> body;
  std::function<std::pair<int, std::string>()> answer = {};
  bool open = false;
};

struct http_options {
  std::string what = "--metrics";  // the option that asked for it, for errors
  // When not empty, every request must carry it: "Authorization: Bearer TOKEN" or "?token=TOKEN"
  // (a browser opening the address); others get 401. Beyond loopback: at least 16 characters.
  std::string token;
  // Beyond loopback without a token: refused, unless the port is meant to be public.
  bool is_public = false;
  std::chrono::milliseconds deadline{5000};  // for a request's head to arrive, and for its answer to leave
  std::size_t max_connections = 256;         // open at once (at most an eighth of the descriptors allowed)
  std::size_t max_per_address = 8;           // open at once from one address
};

// The shortest token a port beyond loopback accepts.
constexpr std::size_t min_token_length = 16;

class http_server {
 public:
  // Binds `address` (see parse_listen_address) and serves `pages` until destroyed; throws
  // std::invalid_argument for a bad address (or a missing or short token, see http_options) and
  // std::runtime_error naming the address when it cannot bind.
  http_server(const std::string& address, std::vector<page> pages, http_options o = {});
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;
  std::string host() const;
  std::uint16_t port() const;

  struct impl;  // the listener and its connections (one Asio thread)

 private:
  std::unique_ptr<impl> p_;
};

// GET /metrics: the registry in the Prometheus text format; GET /healthz: 200 while the process
// serves; GET /readyz: 200 "ready", or 503 and the reason `not_ready` gives (empty: ready; not
// set: always ready), for a load balancer or a unit's watchdog.
class exporter {
 public:
  // /metrics takes o's token; /healthz and /readyz are open.
  exporter(const registry& r, const std::string& address, http_options o = {},
           std::function<std::string()> not_ready = {});
  std::string host() const { return http_.host(); }
  std::uint16_t port() const { return http_.port(); }

 private:
  http_server http_;
};

}  // namespace cleave::metrics
