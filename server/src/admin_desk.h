// The sessions of operators (certificates of the admin role) on a server: requests about jobs
// answered by the long-running server's handler, one reply each. A server that runs no jobs
// (no handler) refuses such certificates.
#pragma once

#include <functional>
#include <string>

#include "cleave/protocol/protocol.h"
#include "cleave/runtime/sessions.h"

namespace cleave::server {

// Answers a request of the admin named `who` (its certificate's name); a core::error it throws
// becomes a reply that is not ok, with the reason. Runs on the node's I/O thread.
using admin_handler = std::function<protocol::admin_reply(const protocol::admin_request&, const std::string& who)>;

class admin_desk {
 public:
  explicit admin_desk(const admin_handler& h) : h_(h) {}
  // A new admin session: welcomed, or refused (throws core::error) when no jobs are taken here.
  void admit(const runtime::session_ptr& s) const;
  // A message on an admin session: an AdminRequest gets its reply; anything else is refused.
  void on_message(const runtime::session_ptr& s, const transport::message& m) const;

 private:
  const admin_handler& h_;
};

}  // namespace cleave::server
