// Membership by connection. A session is one authenticated channel and what its first message
// (a Hello) said; the acceptor serves the sessions of a listening node, the upstream link keeps
// one session to the node above, reconnecting with exponential backoff and jitter.
#pragma once

#include <asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cleave/core/tier.h"
#include "cleave/runtime/executors.h"
#include "cleave/split/profiler.h"
#include "cleave/transport/channel.h"
#include "cleave/transport/connect.h"
#include "cleave/transport/emulation.h"
#include "cleave/transport/listener.h"
#include "cleave/transport/tls_context.h"

namespace cleave::runtime {

class segment_runner;

struct session {
  transport::channel ch;  // never reassigned: a new connection is a new session
  std::string identity;   // the certificate's name
  core::tier role = core::tier::device;
  std::uint32_t id = 0;  // node id from its Hello
  bool open = true;      // I/O thread

  // Thread-safe; false when the channel is closed (the reader reports why).
  bool post(transport::message_builder&& m) const { return ch.post(std::move(m)); }
  // The link as this end measured it, for a profile naming the node at the other end.
  split::link_sample measured_link(std::uint32_t peer_id) const {
    const auto st = ch.stats();
    return {peer_id, static_cast<float>(transport::link_rtt_us(st)),
            static_cast<float>(transport::link_bytes_per_second(st))};
  }
};
using session_ptr = std::shared_ptr<session>;

// Whether a link's measured bandwidth moved by more than 1.5x either way from `reported`, the
// figure last sent upstream (0: none yet): the splitter should hear of it now, not at the next
// profile period (at 20 steps of a slow board, tens of seconds).
inline bool bandwidth_moved(float reported, float now) {
  return reported > 0 && now > 0 && (now > 1.5f * reported || now * 1.5f < reported);
}

// The emulated links and slowdowns of the rounds up to `round` (transport::link_schedule): link
// caps set on the open sessions they name, slowdowns taken by the node's segment runner, in order,
// on its compute thread.
void advance_schedule(transport::link_schedule& schedule, std::uint64_t round, const std::vector<session_ptr>& open,
                      executors& ex, std::optional<segment_runner>& runner);

// Timeouts of every channel of a node.
struct link_settings {
  std::chrono::milliseconds idle_timeout{10000};  // no frame for this long: the link is gone
  double reconnect_max_s = 5.0;                   // backoff cap between reconnection attempts
  // Refused this many times in a row (an Error before admission): a configuration a retry will
  // not fix; the node stops with the reason. After a refusal or a failed handshake it waits >= 1 s.
  int max_refusals = 5;
  // The upstream unreachable this long in a row: the node stops with an error (0: it waits for
  // good, as a service does for a server that comes back or a run that starts later).
  double give_up_s = 0;
};

class acceptor {
 public:
  struct handlers {
    // The first message of a new session; throw core::error to refuse it (sent as an Error).
    std::function<void(const session_ptr&, const transport::message& hello)> on_hello;
    // Every later message; a core::error closes that session with the reason.
    std::function<void(const session_ptr&, transport::message)> on_message;
    // Once per session that passed on_hello, when it ends for any reason.
    std::function<void(const session_ptr&, const std::string& why)> on_closed;
  };
  acceptor(executors& ex, const transport::tls_context& tls, const std::string& host, std::uint16_t port,
           std::vector<std::string> allowed, const link_settings& links, handlers h);
  std::uint16_t port() const { return listener_.port(); }
  // Every open session (I/O thread).
  const std::list<session_ptr>& sessions() const { return sessions_; }
  std::vector<session_ptr> open() const { return {sessions_.begin(), sessions_.end()}; }
  // Bytes sent and received on the open sessions' channels.
  std::uint64_t bytes_moved() const;
  // Ends a session: on_closed runs now, its channel closes in the background.
  void close(const session_ptr& s, const std::string& why);
  // Closes, with an Error saying why, every session whose peer certificate the revocation list
  // now in force lists (after a reload); returns how many.
  std::size_t close_revoked();
  // Sends the revocation list in force (if any) to every open session.
  void send_revocations() const;
  // I/O thread: every peer that has connected, by certificate name: up now or not, bytes over all
  // its connections, and its open channel's figures (RTT, bandwidth; zero when it is down).
  struct link_report {
    std::string peer;
    core::tier role = core::tier::device;
    bool up = false;
    std::uint64_t sent = 0, received = 0;
    transport::channel_stats last;
  };
  std::vector<link_report> links() const;
  // I/O thread: links() into the node's metrics.
  void publish_links() const;
  // Stops accepting and closes every session cleanly (what was posted still goes out).
  asio::awaitable<void> shutdown();

 private:
  asio::awaitable<void> accept_loop();
  asio::awaitable<void> serve(session_ptr s);

  executors& ex_;
  transport::tls_context tls_;  // the listener's (shared) state: what is revoked now
  transport::listener listener_;
  handlers h_;
  std::list<session_ptr> sessions_;
  bool closing_ = false;  // shutdown() began: a session that comes after is closed, not admitted
  // Bytes of each peer's closed sessions (sent, received), so that its totals never go back.
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> closed_bytes_;
};

class upstream {
 public:
  struct handlers {
    // A new channel is up: the node sends its Hello (and anything to announce again).
    std::function<void(const session_ptr&)> on_connected;
    // Every message but an Error, which is logged (shutting_down stops the node); a core::error
    // drops the link.
    std::function<void(transport::message)> on_message;
    std::function<void(const std::string& why)> on_lost;
  };
  // `name`: the certificate name the upstream must have ("" = any the CA signed); `roles`: the
  // tiers its certificate may hold (a peer with another is left, counted as a refusal).
  upstream(executors& ex, const transport::tls_context& tls, std::string host, std::uint16_t port, std::string name,
           std::vector<core::tier> roles, const link_settings& links, handlers h);
  // Connects and serves until the node stops; reconnects after every loss.
  asio::awaitable<void> run();
  // Thread-safe: posts on the current channel; false (message dropped) while disconnected.
  bool post(transport::message_builder&& m) const;
  // Thread-safe: the current session, if connected.
  session_ptr current() const;
  // I/O thread: closes the current channel with an Error saying why (then reconnects).
  void drop(const std::string& why);
  // I/O thread: closes the current channel when the revocation list now in force lists the
  // upstream's certificate (after a reload); true if it did.
  bool drop_revoked();
  // I/O thread: the link to the upstream into the node's metrics.
  void publish_links() const;
  asio::awaitable<void> shutdown();

 private:
  // One connection attempt; null when it failed (logged, and counted when it was a refusal).
  asio::awaitable<session_ptr> attempt(double& backoff);
  // Serves a connected session until it ends; returns the reason the upstream refused this
  // node, if it did before admitting it.
  asio::awaitable<std::string> serve(session_ptr s);
  // An Error from the node above; returns the reason when it refuses this node.
  std::string on_error(const wire::Error& e);
  // Counts a refusal; true when the node gives up (it has then been stopped).
  bool refused(const std::string& why, double& backoff);
  // Why a freshly connected upstream is not the one configured ("" when it is).
  std::string wrong_peer(const session& s) const;
  // A failed attempt to reach the upstream, logged so that an outage of hours stays readable: the
  // first attempts each, then a summary at growing intervals (30 s doubling up to 30 min).
  void unreachable(const std::string& why, double backoff);

  executors& ex_;
  const transport::tls_context& tls_;
  std::string host_, name_;
  std::vector<core::tier> roles_;
  std::uint16_t port_;
  link_settings links_;
  handlers h_;
  mutable std::mutex mu_;
  session_ptr cur_;
  int n_refused_ = 0;                                                          // in a row
  bool waiting_for_job_ = false;  // the upstream said it runs no job (logged once)
  int n_unreachable_ = 0;                                                      // attempts in a row that reached nothing
  std::chrono::steady_clock::time_point unreachable_since_{}, next_report_{};  // the first of those, the next summary
  std::chrono::seconds report_every_{30};
  std::string peer_;                                      // the identity of the last connected upstream
  std::pair<std::uint64_t, std::uint64_t> closed_bytes_;  // of its earlier channels (sent, received)
};

// A node's reload (SIGHUP): reads its certificate, key, CA and revocation list again for new
// handshakes, then closes the sessions of peers whose certificates the list now revokes (`below`
// and `above` may be null). Channels of the other peers carry on. A bad file keeps the state in
// force, with the reason logged. I/O thread.
void reload_credentials(const executors& ex, transport::tls_context& tls, acceptor* below, upstream* above);

// The revocation list in force (if any) to one session below, once it is welcomed.
void send_revocations(const transport::tls_context& tls, const session_ptr& s);

// A revocation list from upstream: when it is the CA's and newer than the one in force, it is put
// in force (tls_context::adopt_revocation_list), the sessions of peers it revokes close, and it
// goes on to the sessions below. One that is not the CA's is refused with an error in the log,
// the list in force staying. I/O thread.
void adopt_revocations(const executors& ex, transport::tls_context& tls, acceptor* below, upstream* above,
                       const wire::Revocations& r);

}  // namespace cleave::runtime
