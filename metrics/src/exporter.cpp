#include "cleave/metrics/exporter.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
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

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

namespace {

// The process_* families Prometheus client libraries export for every process, in the text
// format: CPU seconds, resident and virtual memory, start time, open and allowed file
// descriptors; read from /proc/self ("" where it is not there).
std::string process_metrics() {
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (!std::getline(stat, line)) return "";
  // The fields after the command name in parentheses (which may hold spaces), from field 3 on.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream in(line.substr(close + 2));
  std::vector<std::string> f;
  for (std::string w; in >> w;) f.push_back(w);
  if (f.size() < 22) return "";
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  const auto field = [&](int n) { return std::stod(f[static_cast<std::size_t>(n - 3)]); };  // 1-based, as proc(5)
  // The machine's boot time (seconds since the epoch) does not change: read once.
  static const double boot = [] {
    std::ifstream machine("/proc/stat");
    for (std::string l; std::getline(machine, l);)
      if (l.rfind("btime ", 0) == 0) return std::stod(l.substr(6));
    return 0.0;
  }();
  std::error_code ec;
  std::size_t fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != decltype(it)();
       it.increment(ec))
    ++fds;
  rlimit lim{};
  const double max_fds = ::getrlimit(RLIMIT_NOFILE, &lim) == 0 ? static_cast<double>(lim.rlim_cur) : 0;
  std::string out;
  const auto put = [&](const char* name, const char* type, const char* help, double v) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} {2}\n{0} {3}\n", name, help, type, v);
  };
  put("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
      (field(14) + field(15)) / tick);
  put("process_max_fds", "gauge", "Maximum number of open file descriptors.", max_fds);
  put("process_open_fds", "gauge", "Number of open file descriptors.", static_cast<double>(fds));
  put("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", field(24) * page);
  put("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
      boot + field(22) / tick);
  put("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", field(23));
  return out;
}

// Compared in time independent of where they differ.
bool same_token(const std::string& given, const std::string& token) {
  if (given.size() != token.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < token.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ token[i]);
  return diff == 0;
}

}  // namespace

struct http_server::impl {
  httplib::Server server;
  std::string host;
  int port = 0;
  std::thread thread;
};

http_server::http_server(const std::string& address, std::vector<page> pages, http_options o)
    : p_(std::make_unique<impl>()) {
  auto [host, port] = parse_listen_address(address, o.what);
  if (o.token_beyond_loopback && o.token.empty() && !is_loopback_host(host))
    throw std::invalid_argument(o.what + " " + address + ": serving beyond loopback needs a token (" + o.what +
                                "-token)");
  p_->host = host;
  if (!o.token.empty())
    p_->server.set_pre_routing_handler([token = o.token](const httplib::Request& req, httplib::Response& res) {
      static const std::string bearer = "Bearer ";
      const std::string auth = req.get_header_value("Authorization");
      if ((auth.rfind(bearer, 0) == 0 && same_token(auth.substr(bearer.size()), token)) ||
          (req.has_param("token") && same_token(req.get_param_value("token"), token)))
        return httplib::Server::HandlerResponse::Unhandled;
      res.status = 401;
      res.set_header("WWW-Authenticate", "Bearer");
      res.set_content("a token is required: ?token=TOKEN or Authorization: Bearer TOKEN\n", "text/plain");
      return httplib::Server::HandlerResponse::Handled;
    });
  for (auto& pg : pages)
    p_->server.Get(pg.path, [pg](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      if (!pg.answer) return res.set_content(pg.body(), pg.content_type.c_str());
      auto [status, body] = pg.answer();
      res.status = status;
      res.set_content(body, pg.content_type.c_str());
    });
  // SO_REUSEADDR only: the library's default adds SO_REUSEPORT, with which a second node on
  // the same port would bind too and share the requests instead of being refused.
  p_->server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  p_->server.set_keep_alive_max_count(16);
  p_->server.set_read_timeout(5, 0);
  p_->server.set_write_timeout(5, 0);
  p_->port = port == 0 ? p_->server.bind_to_any_port(host) : (p_->server.bind_to_port(host, port) ? port : -1);
  if (p_->port <= 0) throw std::runtime_error(o.what + ": cannot listen on " + address);
  p_->thread = std::thread([this] { p_->server.listen_after_bind(); });
  // Serving before the constructor returns: a stop() that came before the loop began would be
  // lost, and the destructor would wait for ever.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!p_->server.is_running() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!p_->server.is_running()) {
    p_->server.stop();
    p_->thread.join();
    throw std::runtime_error(o.what + ": the HTTP server on " + address + " did not start");
  }
}

http_server::~http_server() {
  p_->server.stop();
  if (p_->thread.joinable()) p_->thread.join();
}

std::string http_server::host() const {
  return p_->host;
}
std::uint16_t http_server::port() const {
  return static_cast<std::uint16_t>(p_->port);
}

exporter::exporter(const registry& r, const std::string& address, const std::string& what,
                   std::function<std::string()> not_ready)
    : http_(address,
            {page{"/metrics", "text/plain; version=0.0.4; charset=utf-8",
                  [&r] { return r.render() + process_metrics(); }},
             page{"/healthz", "text/plain; charset=utf-8", [] { return std::string("ok\n"); }},
             page{"/readyz",
                  "text/plain; charset=utf-8",
                  {},
                  [not_ready = std::move(not_ready)] {
                    const std::string why = not_ready ? not_ready() : std::string();
                    return why.empty() ? std::pair<int, std::string>{200, "ready\n"}
                                       : std::pair<int, std::string>{503, why + "\n"};
                  }}},
            http_options{what, {}, false}) {}

}  // namespace cleave::metrics
