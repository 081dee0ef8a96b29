// Sessions: the acceptor's accept loop and one coroutine per session; the upstream link's
// connect / serve / back off loop.
#include "cleave/runtime/sessions.h"

#include "cleave/runtime/segment_runner.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <asio/experimental/as_tuple.hpp>
#include <random>

#include "cleave/core/error.h"
#include "cleave/protocol/protocol.h"
#include "cleave/runtime/node_metrics.h"

namespace cleave::runtime {

using clock = std::chrono::steady_clock;

namespace {

// Failed attempts in a row to reach the upstream that are each logged before they are summarised.
constexpr int first_reports = 3;

asio::awaitable<void> close_channel(session_ptr s) {
  co_await s->ch.close();
}

transport::listener_options listen_options(std::vector<std::string> allowed, const link_settings& links) {
  transport::listener_options lo;
  lo.allowed_identities = std::move(allowed);
  lo.channel.idle_timeout = links.idle_timeout;
  return lo;
}

// A connect failure that says a certificate was refused, by the upstream (its TLS alert) or by
// this node's own check of the upstream's certificate.
bool certificate_refused(const std::string& why) {
  return why.find("TLS alert") != std::string::npos || why.find("certificate '") != std::string::npos ||
         why.find("is not on the allow-list") != std::string::npos;
}

}  // namespace

void advance_schedule(transport::link_schedule& schedule, std::uint64_t round, const std::vector<session_ptr>& open,
                      executors& ex, std::optional<segment_runner>& runner) {
  std::vector<transport::link_schedule::peer> peers;
  for (const auto& s : open)
    if (s) peers.push_back({s->identity, &s->ch});
  for (const auto& ev : schedule.advance(round, peers))
    ex.post_compute([&runner, s = ev.slowdown] { runner->set_slowdown(s); });
}

acceptor::acceptor(executors& ex, const transport::tls_context& tls, const std::string& host, std::uint16_t port,
                   std::vector<std::string> allowed, const link_settings& links, handlers h)
    : ex_(ex),
      tls_(tls),
      listener_(ex.io().get_executor(), tls, asio::ip::tcp::endpoint(asio::ip::make_address(host), port),
                listen_options(std::move(allowed), links)),
      h_(std::move(h)) {
  ex_.spawn(accept_loop(), "accepting connections");
}

asio::awaitable<void> acceptor::accept_loop() {
  while (!ex_.stopping()) {
    auto r = co_await listener_.accept();
    if (!r) co_return;  // closed
    auto s = std::make_shared<session>();
    s->ch = std::move(r.value());
    s->identity = s->ch.peer_identity();
    ex_.spawn(serve(std::move(s)), "a session");
  }
}

asio::awaitable<void> acceptor::serve(session_ptr s) {
  auto first = co_await s->ch.receive();
  if (!first) co_return;
  if (closing_) {  // accepted as the node stopped: shutdown() has already closed the sessions it had
    s->post(transport::make_error(wire::ErrorCode::shutting_down, "this node is stopping"));
    co_await s->ch.close();
    co_return;
  }
  std::string refused;
  const char* reason = "revoked";
  try {
    // A handshake that began before a reload met the previous list.
    if (tls_.revokes(s->ch.peer_serial()))
      throw core::error("certificate '" + s->identity + "' (serial " + s->ch.peer_serial() + ") is revoked");
    reason = "hello";
    std::tie(s->role, s->id) = protocol::admitted_hello(*first, s->identity, s->ch.peer_role(), s->ch.peer_node_id());
    reason = "admission";
    h_.on_hello(s, *first);
  } catch (const core::error& e) {
    refused = e.what();
  }
  if (!refused.empty()) {
    ex_.metrics().add("cleave_refusals_total", {{"reason", reason}});
    spdlog::warn("{}: refused {} ({}): {}", ex_.who(), s->identity, s->ch.remote(), refused);
    s->post(transport::make_error(wire::ErrorCode::refused, refused));
    s->open = false;
    co_await s->ch.close();
    co_return;
  }
  sessions_.push_back(s);
  while (s->open) {
    auto m = co_await s->ch.receive();
    if (!s->open) break;
    if (!m) {
      close(s, m.error().reason());
      break;
    }
    try {
      h_.on_message(s, std::move(m.value()));
    } catch (const core::error& e) {
      ex_.metrics().add("cleave_refusals_total", {{"reason", "message"}});
      s->post(transport::make_error(wire::ErrorCode::bad_message, e.what()));
      close(s, e.what());
    }
  }
}

std::uint64_t acceptor::bytes_moved() const {
  std::uint64_t b = 0;
  for (const auto& s : sessions_) {
    const auto st = s->ch.stats();
    b += st.bytes_sent + st.bytes_received;
  }
  return b;
}

std::vector<acceptor::link_report> acceptor::links() const {
  std::map<std::string, link_report> peers;
  for (const auto& [peer, b] : closed_bytes_) {
    peers[peer].sent = b.first;
    peers[peer].received = b.second;
  }
  for (const auto& s : sessions_) {
    auto& t = peers[s->identity];
    t.role = s->role;
    t.last = s->ch.stats();
    t.sent += t.last.bytes_sent;
    t.received += t.last.bytes_received;
    t.up = true;
  }
  std::vector<link_report> out;
  for (auto& [peer, t] : peers) {
    t.peer = peer;
    out.push_back(std::move(t));
  }
  return out;
}

void acceptor::publish_links() const {
  for (const auto& t : links()) publish_link(ex_.metrics(), t.peer, t.up, t.sent, t.received, t.last);
}

void acceptor::close(const session_ptr& s, const std::string& why) {
  if (!s->open) return;
  s->open = false;
  const auto st = s->ch.stats();
  auto& b = closed_bytes_[s->identity];
  b.first += st.bytes_sent;
  b.second += st.bytes_received;
  sessions_.remove(s);
  h_.on_closed(s, why);
  ex_.spawn(close_channel(s), "closing a session");
}

std::size_t acceptor::close_revoked() {
  std::size_t n = 0;
  const auto all = sessions_;
  for (const auto& s : all) {
    if (!tls_.revokes(s->ch.peer_serial())) continue;
    const std::string why = "certificate '" + s->identity + "' (serial " + s->ch.peer_serial() + ") is revoked";
    spdlog::warn("{}: closing the session of {} ({}): {}", ex_.who(), s->identity, s->ch.remote(), why);
    s->post(transport::make_error(wire::ErrorCode::refused, why));
    close(s, why);
    ++n;
  }
  return n;
}

void acceptor::send_revocations() const {
  for (const auto& s : sessions_) runtime::send_revocations(tls_, s);
}

asio::awaitable<void> acceptor::shutdown() {
  closing_ = true;
  listener_.close();
  const auto all = sessions_;
  sessions_.clear();
  for (const auto& s : all) {
    s->open = false;
    co_await s->ch.close();
  }
}

upstream::upstream(executors& ex, const transport::tls_context& tls, std::string host, std::uint16_t port,
                   std::string name, std::vector<core::tier> roles, const link_settings& links, handlers h)
    : ex_(ex),
      tls_(tls),
      host_(std::move(host)),
      name_(std::move(name)),
      roles_(std::move(roles)),
      port_(port),
      links_(links),
      h_(std::move(h)) {}

bool upstream::post(transport::message_builder&& m) const {
  const auto s = current();
  if (s && s->post(std::move(m))) return true;
  ex_.metrics().add("cleave_frames_dropped_total", {});
  return false;
}

void upstream::publish_links() const {
  if (peer_.empty()) return;
  const auto s = current();
  const auto st = s ? s->ch.stats() : transport::channel_stats{};
  publish_link(ex_.metrics(), peer_, s != nullptr, closed_bytes_.first + st.bytes_sent,
               closed_bytes_.second + st.bytes_received, st);
}

session_ptr upstream::current() const {
  std::lock_guard lock(mu_);
  return cur_;
}

asio::awaitable<void> upstream::run() {
  constexpr auto nothrow = asio::experimental::as_tuple(asio::use_awaitable);
  std::minstd_rand jitter(std::random_device{}());
  double backoff = 0.2;
  asio::steady_timer pause(ex_.io());
  while (!ex_.stopping()) {
    if (auto s = co_await attempt(backoff)) {
      const auto since = clock::now();
      const std::string refusal = co_await serve(s);
      if (ex_.stopping()) co_return;
      // A link that held for a while comes back at once; one that keeps failing backs off.
      if (clock::now() - since > std::chrono::seconds(5)) backoff = 0.2;
      if (!refusal.empty() && refused(refusal, backoff)) co_return;
    }
    if (ex_.stopping()) co_return;  // given up
    // Between attempts: the backoff, spread over [50%, 100%] so that many nodes that lost one
    // server do not come back in lockstep.
    const double wait = backoff * std::uniform_real_distribution<double>(0.5, 1.0)(jitter);
    pause.expires_after(std::chrono::microseconds(static_cast<std::int64_t>(wait * 1e6)));
    co_await pause.async_wait(nothrow);
    backoff = std::min(links_.reconnect_max_s, backoff * 2);
  }
}

asio::awaitable<session_ptr> upstream::attempt(double& backoff) {
  transport::connect_options opts;
  opts.channel.idle_timeout = links_.idle_timeout;
  if (!name_.empty()) opts.server_identity = name_;
  auto r = co_await transport::connect(tls_, host_, port_, opts);
  if (ex_.stopping()) co_return nullptr;
  if (!r) {
    // A certificate refused (a TLS alert from the upstream, or its certificate failing this
    // node's checks) counts towards giving up. Any other failed handshake waits as a refusal
    // does but is retried for good: one cut short by an overloaded upstream looks like that.
    const std::string& why = r.error().reason();
    if (r.error().code() == transport::errc::refused && certificate_refused(why)) {
      spdlog::warn("{}: {}:{} refused: {}", ex_.who(), host_, port_, why);
      refused(why, backoff);
      co_return nullptr;
    }
    if (r.error().code() == transport::errc::refused) backoff = std::max(backoff, 2.0);
    unreachable(why, backoff);
    co_return nullptr;
  }
  auto s = std::make_shared<session>();
  s->ch = std::move(r.value());
  s->identity = s->ch.peer_identity();
  if (const std::string wrong = wrong_peer(*s); !wrong.empty()) {
    // Nothing is sent to a node that is not the one configured: not a Hello, not data.
    spdlog::error("{}: {} at {}:{} is not the configured upstream: {}", ex_.who(), s->identity, host_, port_, wrong);
    co_await s->ch.close();
    refused(wrong, backoff);
    co_return nullptr;
  }
  if (n_unreachable_ > first_reports)
    spdlog::info("{}: connected to {} ({}) after {} failed attempts over {:.0f} s", ex_.who(), s->identity,
                 s->ch.remote(), n_unreachable_,
                 std::chrono::duration<double>(clock::now() - unreachable_since_).count());
  else
    spdlog::info("{}: connected to {} ({})", ex_.who(), s->identity, s->ch.remote());
  n_unreachable_ = 0;
  co_return s;
}

void upstream::unreachable(const std::string& why, double backoff) {
  const auto now = clock::now();
  if (n_unreachable_++ == 0) {
    unreachable_since_ = now;
    report_every_ = std::chrono::seconds(30);
    next_report_ = now + report_every_;
  }
  const double out_s = std::chrono::duration<double>(now - unreachable_since_).count();
  if (links_.give_up_s > 0 && out_s >= links_.give_up_s) {
    ex_.fail(std::make_exception_ptr(
                 core::error(fmt::format("cannot reach {}:{} for {:.0f} s ({} attempts; --give-up-after {:g}): {}",
                                         host_, port_, out_s, n_unreachable_, links_.give_up_s, why))),
             "connecting");
    return;
  }
  if (n_unreachable_ <= first_reports) {
    spdlog::warn("{}: cannot reach {}:{}: {}; retrying in {:.1f} s{}", ex_.who(), host_, port_, why, backoff,
                 n_unreachable_ == first_reports ? " (further attempts are summarised)" : "");
    return;
  }
  if (now < next_report_) return spdlog::debug("{}: cannot reach {}:{}: {}", ex_.who(), host_, port_, why);
  spdlog::warn("{}: still cannot reach {}:{} after {} attempts over {:.0f} s: {}; retrying every {:.1f} s at most",
               ex_.who(), host_, port_, n_unreachable_, out_s, why, links_.reconnect_max_s);
  report_every_ = std::min<std::chrono::seconds>(report_every_ * 2, std::chrono::minutes(30));
  next_report_ = now + report_every_;
}

asio::awaitable<std::string> upstream::serve(session_ptr s) {
  {
    std::lock_guard lock(mu_);
    cur_ = s;
  }
  if (s->identity != peer_) closed_bytes_ = {};  // another upstream: its own totals
  peer_ = s->identity;
  ex_.metrics().add("cleave_connections_total", {});
  h_.on_connected(s);
  std::string why, refusal;
  bool admitted = false;  // a message other than an Error came
  while (why.empty()) {
    auto m = co_await s->ch.receive();
    if (ex_.stopping()) co_return refusal;  // shutdown() closes it
    if (!m) {
      why = m.error().reason();
      break;
    }
    try {
      if (const auto* err = m->as<wire::Error>(); err && err->code() == wire::ErrorCode::no_job) {
        // Not a refusal: a long-running server between jobs (a job starts, or it stops). Back
        // after the backoff, short when this link held.
        spdlog::info("{}: {}: {}; reconnecting", ex_.who(), name_.empty() ? host_ : name_,
                     core::printable(err->message() ? err->message()->str() : "no job"));
        waiting_for_job_ = true;
        why = "no job running";
      } else if (err) {
        if (auto r = on_error(*err); !r.empty() && !admitted) refusal = r;
      } else {
        admitted = true;
        n_refused_ = 0;
        waiting_for_job_ = false;
        h_.on_message(std::move(m.value()));
      }
    } catch (const core::error& e) {
      spdlog::error("{}: bad message from {}: {}", ex_.who(), s->identity, e.what());
      s->post(transport::make_error(wire::ErrorCode::bad_message, e.what()));
      why = e.what();
    }
  }
  {
    std::lock_guard lock(mu_);
    cur_.reset();
  }
  const auto st = s->ch.stats();
  closed_bytes_.first += st.bytes_sent;
  closed_bytes_.second += st.bytes_received;
  s->open = false;
  if (!waiting_for_job_) h_.on_lost(why);  // turned away before anything was in flight
  co_await s->ch.close();
  co_return refusal;
}

std::string upstream::wrong_peer(const session& s) const {
  const auto role = s.ch.peer_role();
  auto names = [this] {
    std::string out;
    for (auto r : roles_) out += (out.empty() ? "" : " or ") + std::string(core::tier_name(r));
    return out;
  };
  if (!role) return "its certificate '" + s.identity + "' holds no role (expected " + names() + ")";
  if (std::find(roles_.begin(), roles_.end(), *role) == roles_.end())
    return "its certificate '" + s.identity + "' is for the " + std::string(core::tier_name(*role)) +
           " role, expected " + names() +
           (roles_ == std::vector{core::tier::server} && name_.empty()
                ? " (an agent behind an edge names it with --upstream-name or "
                  "--upstream-role edge)"
                : "");
  return {};
}

std::string upstream::on_error(const wire::Error& e) {
  const std::string text = core::printable(e.message() ? e.message()->str() : "");
  if (e.code() == wire::ErrorCode::shutting_down) {
    ex_.stop(text.empty() ? "training finished" : text);
    return {};
  }
  spdlog::warn("{}: {} reports: {}", ex_.who(), name_.empty() ? host_ : name_, text);
  return e.code() == wire::ErrorCode::refused ? (text.empty() ? "refused" : text) : std::string();
}

bool upstream::refused(const std::string& why, double& backoff) {
  ex_.metrics().add("cleave_refusals_total", {{"reason", "upstream"}});
  backoff = std::max(backoff, 2.0);  // waits of 1 to 2 s: at most one attempt a second
  if (++n_refused_ < links_.max_refusals) return false;
  ex_.fail(std::make_exception_ptr(
               core::error("refused by " + (name_.empty() ? host_ + ":" + std::to_string(port_) : name_) + " " +
                           std::to_string(n_refused_) + " times in a row: " + why +
                           " (check this node's certificate, its id and the upstream's allowed names)")),
           "connecting");
  return true;
}

void upstream::drop(const std::string& why) {
  const auto s = current();
  if (!s) return;
  spdlog::error("{}: dropping the link to {}: {}", ex_.who(), s->identity, why);
  s->post(transport::make_error(wire::ErrorCode::bad_message, why));
  ex_.spawn(close_channel(s), "dropping a link");
}

bool upstream::drop_revoked() {
  const auto s = current();
  if (!s || !tls_.revokes(s->ch.peer_serial())) return false;
  spdlog::warn("{}: closing the link to {} ({}): its certificate (serial {}) is revoked", ex_.who(), s->identity,
               s->ch.remote(), s->ch.peer_serial());
  ex_.spawn(close_channel(s), "dropping a link");
  return true;
}

namespace {

// A revocation list newly in force: the sessions it revokes close, it goes on below.
void revocations_changed(acceptor* below, upstream* above) {
  if (below) {
    below->close_revoked();
    below->send_revocations();
  }
  if (above) above->drop_revoked();
}

}  // namespace

void reload_credentials(const executors& ex, transport::tls_context& tls, acceptor* below, upstream* above) {
  std::string loaded;
  try {
    loaded = tls.reload();
  } catch (const core::error& e) {
    spdlog::error("{}: reload refused, the certificates in use stay: {}", ex.who(), e.what());
    return;
  }
  spdlog::info("{}: reloaded for new connections: {}", ex.who(), loaded);
  revocations_changed(below, above);
}

void send_revocations(const transport::tls_context& tls, const session_ptr& s) {
  if (const auto crl = tls.revocation_list(); !crl.empty()) s->post(protocol::make_revocations(crl));
}

void adopt_revocations(const executors& ex, transport::tls_context& tls, acceptor* below, upstream* above,
                       const wire::Revocations& r) {
  std::optional<std::string> now;
  try {
    now = tls.adopt_revocation_list({r.crl()->data(), r.crl()->size()});
  } catch (const core::error& e) {
    spdlog::error("{}: a revocation list from upstream refused, the one in force stays: {}", ex.who(), e.what());
    return;
  }
  if (!now) return;  // the one in force, or an older one
  spdlog::info("{}: revocation list from upstream in force: {}", ex.who(), *now);
  revocations_changed(below, above);
}

asio::awaitable<void> upstream::shutdown() {
  if (auto s = current()) {
    s->open = false;
    co_await s->ch.close();
  }
}

}  // namespace cleave::runtime
