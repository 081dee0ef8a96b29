// The server's devices: joins, leaves, and which session may speak for which device.
#include "membership.h"

#include "cleave/core/error.h"

namespace cleave::server {

device_state* membership::find(std::uint32_t id) {
  const auto it = devices_.find(id);
  return it == devices_.end() ? nullptr : &it->second;
}

const device_state* membership::find(std::uint32_t id) const {
  const auto it = devices_.find(id);
  return it == devices_.end() ? nullptr : &it->second;
}

int membership::n_connected() const {
  int n = 0;
  for (const auto& [id, d] : devices_) n += d.connected;
  return n;
}

runtime::session_ptr membership::join(std::uint32_t id, const runtime::session_ptr& via) {
  if (id == 0 || id >= 1000000) throw core::error("device id " + std::to_string(id) + " out of range");
  auto& d = devices_[id];
  const auto old = d.connected ? d.via : nullptr;
  // The same identity on a newer channel supersedes the older one (half-open, or reconnected
  // before the old one timed out); closing the older one then changes nothing.
  if (old && old != via && old->identity != via->identity)
    throw core::error("device " + std::to_string(id) + " is already connected through " + old->identity);
  d = device_state{};
  d.via = via;
  d.behind_edge = via->role == core::tier::edge;
  d.connected = true;
  return old;
}

bool membership::leave(std::uint32_t id) {
  auto* d = find(id);
  if (!d || !d->connected) return false;
  d->connected = false;
  d->rs.next.reset();
  if (d->behind_edge) left_via_[d->via].insert(id);
  return true;
}

std::vector<std::uint32_t> membership::closed(const runtime::session_ptr& s) {
  // Only the devices attached through this very session: a superseded one changes nothing.
  std::vector<std::uint32_t> gone;
  for (const auto& [id, d] : devices_)
    if (d.connected && d.via == s) gone.push_back(id);
  return gone;
}

device_state* membership::attached(std::uint32_t dev, const runtime::session_ptr& s, const char* what) {
  auto* d = find(dev);
  // A device that left through this edge is still named in what the edge sent before it knew,
  // whether or not it has joined again elsewhere since: late, not a lie; dropped.
  const bool here = d && d->via == s && d->connected;
  if (!here && s->role == core::tier::edge)
    if (const auto l = left_via_.find(s); l != left_via_.end() && l->second.count(dev)) return nullptr;
  if (!here)
    throw core::error(std::string(what) + " for device " + std::to_string(dev) + ", which is not attached through " +
                      s->identity);
  if (s->role == core::tier::device && dev != s->id)
    throw core::error("device " + std::to_string(s->id) + " sent a " + what + " for device " + std::to_string(dev));
  return d;
}

}  // namespace cleave::server
