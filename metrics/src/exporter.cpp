#include "cleave/metrics/exporter.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <stdexcept>
#include <thread>

namespace cleave::metrics {

std::pair<std::string, std::uint16_t> parse_listen_address(const std::string& text, const std::string& what) {
  std::string host = "127.0.0.1", port = text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      throw std::invalid_argument(what + ": '" + text + "' is not [IPV6]:PORT");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else if (const auto colon = text.rfind(':'); colon != std::string::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty() || port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port) > 65535)
    throw std::invalid_argument(what + ": '" + text + "' is not PORT or HOST:PORT");
  return {host, static_cast<std::uint16_t>(std::stoul(port))};
}

struct exporter::impl {
  httplib::Server server;
  std::string host;
  int port = 0;
  std::thread thread;
};

exporter::exporter(const registry& r, const std::string& address, const std::string& what)
    : p_(std::make_unique<impl>()) {
  auto [host, port] = parse_listen_address(address, what);
  p_->host = host;
  p_->server.Get("/metrics", [&r](const httplib::Request&, httplib::Response& res) {
    res.set_content(r.render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  // SO_REUSEADDR only: the library's default adds SO_REUSEPORT, with which a second node on
  // the same port would bind too and share the scrapes instead of being refused.
  p_->server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  p_->server.set_keep_alive_max_count(16);
  p_->server.set_read_timeout(5, 0);
  p_->server.set_write_timeout(5, 0);
  p_->port = port == 0 ? p_->server.bind_to_any_port(host) : (p_->server.bind_to_port(host, port) ? port : -1);
  if (p_->port <= 0) throw std::runtime_error(what + ": cannot listen on " + address);
  p_->thread = std::thread([this] { p_->server.listen_after_bind(); });
  // Serving before the constructor returns: a stop() that came before the loop began would be
  // lost, and the destructor would wait for ever.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!p_->server.is_running() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!p_->server.is_running()) {
    p_->server.stop();
    p_->thread.join();
    throw std::runtime_error(what + ": the HTTP server on " + address + " did not start");
  }
}

exporter::~exporter() {
  p_->server.stop();
  if (p_->thread.joinable()) p_->thread.join();
}

std::string exporter::host() const {
  return p_->host;
}
std::uint16_t exporter::port() const {
  return static_cast<std::uint16_t>(p_->port);
}

}  // namespace cleave::metrics
