// Operators' sessions: one reply per request, every action logged with the certificate's name.
#include "admin_desk.h"

#include <spdlog/spdlog.h>

#include "cleave/core/error.h"

namespace cleave::server {

void admin_desk::admit(const runtime::session_ptr& s) const {
  if (!h_) throw core::error("this server runs no jobs (started without --state): the admin role is not served");
  spdlog::debug("server: admin {} connected ({})", s->identity, s->ch.remote());
  protocol::welcome_info w;
  s->post(protocol::make_welcome(w));
}

void admin_desk::on_message(const runtime::session_ptr& s, const transport::message& m) const {
  if (m.type() != wire::Body::AdminRequest)
    throw core::error("unexpected " + std::string(transport::body_name(m.type())) + " from admin " + s->identity);
  const auto req = protocol::admin_request_of(*m.as<wire::AdminRequest>());
  protocol::admin_reply r;
  try {
    r = h_(req, s->identity);
  } catch (const core::error& e) {
    r = {};
    r.text = e.what();
    spdlog::warn("server: admin {}: {}{} refused: {}", s->identity, req.action,
                 req.job ? " of job " + std::to_string(req.job) : std::string(), e.what());
  }
  s->post(protocol::make_admin_reply(r));
}

}  // namespace cleave::server
