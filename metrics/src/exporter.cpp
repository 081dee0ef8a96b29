#include "cleave/metrics/exporter.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <asio.hpp>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
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

namespace {

using asio::ip::tcp;

// A request's head (request line and headers) may not be longer.
constexpr std::size_t max_head_bytes = 16 * 1024;

struct reply {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  const char* extra = "";  // header lines, each ending in \r\n
};

std::string_view reason_of(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Status";
  }
}

std::string rendered(const reply& r, bool with_body) {
  return fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: "
      "close\r\n{}\r\n{}",
      r.status, reason_of(r.status), r.content_type, r.body.size(), r.extra, with_body ? r.body : std::string());
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Parameter `key` of a query string ("a=1&token=x"), percent-decoded; nullopt when absent.
std::optional<std::string> query_param(std::string_view query, std::string_view key) {
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    const auto eq = pair.find('=');
    if (pair.substr(0, eq) != key) continue;
    std::string out;
    const std::string_view v = eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (v[i] == '%' && i + 2 < v.size() && hex_digit(v[i + 1]) >= 0 && hex_digit(v[i + 2]) >= 0) {
        out += static_cast<char>(hex_digit(v[i + 1]) * 16 + hex_digit(v[i + 2]));
        i += 2;
      } else {
        out += v[i] == '+' ? ' ' : v[i];
      }
    }
    return out;
  }
  return std::nullopt;
}

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

class http_connection;

struct http_server::impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer retry{io};
  std::vector<page> pages;
  http_options o;
  std::string host;
  std::uint16_t port = 0;
  std::size_t cap = 0;
  std::size_t n_open = 0;
  std::map<asio::ip::address, std::size_t> per_address;
  std::set<http_connection*> live;
  std::thread thread;

  void accept();
  void turn_away(tcp::socket& sock) const;
  // The answer to a request's head (HEAD: `head_only`).
  reply answer(std::string_view head, bool& head_only) const;
};

class http_connection : public std::enable_shared_from_this<http_connection> {
 public:
  http_connection(http_server::impl& s, tcp::socket sock, asio::ip::address from)
      : s_(s), sock_(std::move(sock)), deadline_(s.io), from_(std::move(from)), in_(max_head_bytes) {
    ++s_.n_open;
    ++s_.per_address[from_];
    s_.live.insert(this);
  }
  ~http_connection() {
    s_.live.erase(this);
    --s_.n_open;
    if (--s_.per_address[from_] == 0) s_.per_address.erase(from_);
  }

  void start() {
    arm();
    asio::async_read_until(sock_, in_, "\r\n\r\n",
                           [self = shared_from_this()](std::error_code ec, std::size_t n) { self->on_head(ec, n); });
  }
  void abort() {
    std::error_code ignored;
    sock_.close(ignored);
    deadline_.cancel();
  }

 private:
  // The socket closes when the deadline passes first: a peer trickling bytes gets no more time.
  void arm() {
    deadline_.expires_after(s_.o.deadline);
    deadline_.async_wait([self = shared_from_this()](std::error_code ec) {
      if (!ec) self->abort();
    });
  }
  void on_head(std::error_code ec, std::size_t n) {
    if (ec == asio::error::not_found) return send({431, "text/plain; charset=utf-8", "request head too large\n"}, true);
    if (ec) return abort();  // closed, reset, or out of time
    const auto data = in_.data();
    const std::string head(asio::buffers_begin(data), asio::buffers_begin(data) + static_cast<std::ptrdiff_t>(n));
    bool head_only = false;
    reply r;
    try {
      r = s_.answer(head, head_only);
    } catch (const std::exception& e) {
      r = {503, "text/plain; charset=utf-8", std::string("unavailable: ") + e.what() + "\n"};
    }
    send(std::move(r), !head_only);
  }
  void send(const reply& r, bool with_body) {
    out_ = rendered(r, with_body);
    arm();
    asio::async_write(sock_, asio::buffer(out_), [self = shared_from_this()](std::error_code, std::size_t) {
      std::error_code ignored;
      self->sock_.shutdown(tcp::socket::shutdown_both, ignored);
      self->abort();
    });
  }

  http_server::impl& s_;
  tcp::socket sock_;
  asio::steady_timer deadline_;
  asio::ip::address from_;
  asio::streambuf in_;
  std::string out_;
};

void http_server::impl::turn_away(tcp::socket& sock) const {
  // Best effort, without waiting: the peer learns why, and the descriptor goes at once.
  static const std::string busy =
      rendered({503, "text/plain; charset=utf-8", "too many connections\n", "Retry-After: 1\r\n"}, true);
  std::error_code ignored;
  sock.non_blocking(true, ignored);
  sock.send(asio::buffer(busy), 0, ignored);
  sock.close(ignored);
}

void http_server::impl::accept() {
  acceptor.async_accept([this](std::error_code ec, tcp::socket sock) {
    if (!acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors, say: try again shortly rather than spin.
      retry.expires_after(std::chrono::milliseconds(100));
      retry.async_wait([this](std::error_code e) {
        if (!e) accept();
      });
      return;
    }
    std::error_code e;
    const auto peer = sock.remote_endpoint(e);
    if (!e) {
      const auto it = per_address.find(peer.address());
      if (n_open >= cap || (it != per_address.end() && it->second >= o.max_per_address))
        turn_away(sock);
      else
        std::make_shared<http_connection>(*this, std::move(sock), peer.address())->start();
    }
    accept();
  });
}

reply http_server::impl::answer(std::string_view head, bool& head_only) const {
  const auto line_end = head.find("\r\n");
  const std::string_view line = head.substr(0, line_end);
  const auto sp1 = line.find(' '), sp2 = line.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1 || line.substr(sp2 + 1).rfind("HTTP/1.", 0) != 0)
    return {400, "text/plain; charset=utf-8", "malformed request line\n"};
  const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  head_only = method == "HEAD";
  if (method != "GET" && !head_only)
    return {405, "text/plain; charset=utf-8", "only GET and HEAD\n", "Allow: GET, HEAD\r\n"};
  const auto q = target.find('?');
  const std::string_view path = target.substr(0, q), query = q == std::string_view::npos ? "" : target.substr(q + 1);
  const auto pg = std::find_if(pages.begin(), pages.end(), [&](const page& p) { return p.path == path; });
  if (!o.token.empty() && (pg == pages.end() || !pg->open)) {
    bool ok = false;
    if (const auto t = query_param(query, "token")) ok = same_token(*t, o.token);
    for (std::string_view rest = head.substr(line_end + 2); !ok && !rest.empty();) {
      const auto end = rest.find("\r\n");
      const std::string_view h = rest.substr(0, end);
      rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 2);
      const auto colon = h.find(':');
      if (colon == std::string_view::npos || !same_name(h.substr(0, colon), "Authorization")) continue;
      std::string_view v = h.substr(colon + 1);
      while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
      ok = v.size() > 7 && same_name(v.substr(0, 7), "Bearer ") && same_token(std::string(v.substr(7)), o.token);
    }
    if (!ok)
      return {401, "text/plain; charset=utf-8", "a token is required: ?token=TOKEN or Authorization: Bearer TOKEN\n",
              "WWW-Authenticate: Bearer\r\n"};
  }
  if (pg == pages.end()) return {404, "text/plain; charset=utf-8", "not found\n"};
  if (!pg->answer) return {200, pg->content_type, pg->body()};
  auto [status, body] = pg->answer();
  return {status, pg->content_type, std::move(body)};
}

http_server::http_server(const std::string& address, std::vector<page> pages, http_options o)
    : p_(std::make_unique<impl>()) {
  auto [host, port] = parse_listen_address(address, o.what);
  if (!is_loopback_host(host)) {
    if (o.token.empty() && !o.is_public)
      throw std::invalid_argument(o.what + " " + address + ": serving beyond loopback needs a token (" + o.what +
                                  "-token)");
    if (!o.token.empty() && o.token.size() < min_token_length)
      throw std::invalid_argument(o.what + "-token: " + std::to_string(o.token.size()) +
                                  " characters; beyond loopback a token has at least " +
                                  std::to_string(min_token_length));
  }
  if (o.max_connections == 0 || o.max_per_address == 0 || o.deadline.count() <= 0)
    throw std::invalid_argument(o.what + ": connection caps and the deadline must be positive");
  p_->host = host;
  p_->pages = std::move(pages);
  // At most an eighth of the descriptors this process may open: the rest stay for its channels.
  rlimit lim{};
  p_->cap = o.max_connections;
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
    p_->cap = std::clamp<std::size_t>(static_cast<std::size_t>(lim.rlim_cur / 8), 1, o.max_connections);
  p_->o = std::move(o);
  try {
    const tcp::endpoint at(asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host), port);
    p_->acceptor.open(at.protocol());
    // SO_REUSEADDR only: a second node on the same port is refused, not sharing the requests.
    p_->acceptor.set_option(tcp::acceptor::reuse_address(true));
    p_->acceptor.bind(at);
    p_->acceptor.listen();
    p_->port = p_->acceptor.local_endpoint().port();
  } catch (const std::exception& e) {
    throw std::runtime_error(p_->o.what + ": cannot listen on " + address + ": " + e.what());
  }
  p_->accept();
  p_->thread = std::thread([this] { p_->io.run(); });
}

http_server::~http_server() {
  // Everything closes on the server's thread; its run() returns once the last handler has.
  asio::post(p_->io, [p = p_.get()] {
    std::error_code ignored;
    p->acceptor.close(ignored);
    p->retry.cancel();
    for (auto* c : std::vector<http_connection*>(p->live.begin(), p->live.end())) c->abort();
  });
  if (p_->thread.joinable()) p_->thread.join();
}

std::string http_server::host() const {
  return p_->host;
}
std::uint16_t http_server::port() const {
  return p_->port;
}

exporter::exporter(const registry& r, const std::string& address, http_options o,
                   std::function<std::string()> not_ready)
    : http_(address,
            {page{"/metrics", "text/plain; version=0.0.4; charset=utf-8",
                  [&r] { return r.render() + process_metrics(); }},
             page{"/healthz", "text/plain; charset=utf-8", [] { return std::string("ok\n"); }, {}, true},
             page{"/readyz",
                  "text/plain; charset=utf-8",
                  {},
                  [not_ready = std::move(not_ready)] {
                    const std::string why = not_ready ? not_ready() : std::string();
                    return why.empty() ? std::pair<int, std::string>{200, "ready\n"}
                                       : std::pair<int, std::string>{503, why + "\n"};
                  },
                  true}},
            std::move(o)) {}

}  // namespace cleave::metrics
