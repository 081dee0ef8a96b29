// The server's devices: who joined, through which session (its own or its edge's), the plan each
// runs, and the devices that left through an edge that may still send for them.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cleave/core/codec.h"
#include "cleave/runtime/route_state.h"
#include "cleave/runtime/sessions.h"

namespace cleave::server {

struct device_state {
  runtime::session_ptr via;  // the session it is attached through: its own, or its edge's
  bool behind_edge = false;
  bool connected = false;
  runtime::route_state rs;
  std::uint64_t last_step = ~0ULL;  // the last step seen
  bool measured = true;             // has reported a profile since its last re-split
  bool resumes = false;             // continues from the checkpoint resumed (wire::Plan::resume)
  std::string name;                 // from its Hello
  std::uint64_t joined_round = 0;   // the round open when it joined, and when its route last moved
  std::uint64_t moved_round = 0;
  // The plans it ran earlier in the open round, each until the step of the round at which it cut
  // over: priced with the one in force for the round's predicted step.
  struct leg {
    split::route route;
    std::vector<core::hop_codecs> hops;
    std::uint64_t until = 0;
  };
  std::vector<leg> legs;
  // The codecs of each hop of its route chosen by the planner, and of an announced re-split
  // (empty: the most compact allowed ones).
  std::vector<core::hop_codecs> hops, next_hops;
};

class membership {
 public:
  const std::map<std::uint32_t, device_state>& all() const { return devices_; }
  std::map<std::uint32_t, device_state>& all() { return devices_; }
  device_state* find(std::uint32_t id);
  const device_state* find(std::uint32_t id) const;
  int n_connected() const;
  // Device `id` joins through `via`: its state starts afresh. Returns the session it was attached
  // through until now (null: none). Throws core::error when the id is out of range or attached
  // under another identity.
  runtime::session_ptr join(std::uint32_t id, const runtime::session_ptr& via);
  // It left: false when it was not connected.
  bool leave(std::uint32_t id);
  // The devices attached through session s, which closed (what an edge still sends for those
  // that left through it is late from now on).
  std::vector<std::uint32_t> closed(const runtime::session_ptr& s);
  void forget_session(const runtime::session_ptr& s) { left_via_.erase(s); }
  // The device a message from s is about, attached through s; nullptr when it left through that
  // very edge (the edge sent it before it knew); throws core::error when s has no business with it.
  device_state* attached(std::uint32_t dev, const runtime::session_ptr& s, const char* what);

 private:
  std::map<std::uint32_t, device_state> devices_;
  // Per open edge session: the devices that left through it (what it still sends for them is late).
  std::map<runtime::session_ptr, std::set<std::uint32_t>> left_via_;
};

}  // namespace cleave::server
