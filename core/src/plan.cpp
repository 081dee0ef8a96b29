// Routes and plans.
#include "cleave/core/plan.h"

#include <charconv>

#include "cleave/core/error.h"

namespace cleave::core {

std::string_view tier_name(tier t) {
  switch (t) {
    case tier::device:
      return "device";
    case tier::edge:
      return "edge";
    case tier::server:
      return "server";
  }
  return "?";
}

bool route::has_edge() const {
  for (auto t : path)
    if (t == tier::edge) return true;
  return false;
}

std::vector<int> route::segments_on(tier t) const {
  std::vector<int> out;
  for (int i = 0; i < n_segments(); ++i)
    if (path[static_cast<std::size_t>(i)] == t) out.push_back(i);
  return out;
}

std::string route::str() const {
  std::string s;
  for (int i = 0; i < n_segments(); ++i) {
    if (i) s += " ";
    s += std::string(tier_name(path[static_cast<std::size_t>(i)])) + "[" + std::to_string(begin(i)) + "," +
         std::to_string(end(i)) + ")";
  }
  return s;
}

route make_route(bool u_shape, bool with_edge, const std::vector<int>& cuts, int n_blocks) {
  route r;
  r.n_blocks = n_blocks;
  if (u_shape)
    r.path = with_edge ? std::vector{tier::device, tier::edge, tier::server, tier::edge, tier::device}
                       : std::vector{tier::device, tier::server, tier::device};
  else
    r.path = with_edge ? std::vector{tier::device, tier::edge, tier::server} : std::vector{tier::device, tier::server};
  const std::size_t want = r.path.size() - 1;
  const std::string what = std::string(u_shape ? "U-shaped " : "") + (with_edge ? "3-tier" : "2-tier") + " plan";
  if (cuts.size() != want)
    throw error(what + " needs " + std::to_string(want) + " cut" + (want > 1 ? "s" : "") + ", got " +
                std::to_string(cuts.size()));
  int prev = 0;
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    if (cuts[i] < prev || cuts[i] > n_blocks)
      throw error(what + ": cut " + std::to_string(cuts[i]) + " out of order or outside [0, " +
                  std::to_string(n_blocks) + "]");
    prev = cuts[i];
  }
  r.cuts = cuts;
  if (r.end(0) < 1) throw error(what + ": the device must hold at least the first block (raw inputs never leave it)");
  if (u_shape && r.begin(r.n_segments() - 1) >= n_blocks)
    throw error(what + ": the device must hold at least the last block (labels never leave it)");
  return r;
}

tier tier_of_block(const route& r, int block) {
  for (int s = 0; s < r.n_segments(); ++s)
    if (r.begin(s) <= block && block < r.end(s)) return r.path[static_cast<std::size_t>(s)];
  throw error("block " + std::to_string(block) + " is outside the route " + r.str());
}

std::vector<int> parse_cuts(const std::string& text) {
  std::vector<int> cuts;
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    int v = 0;
    const auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc{} || (next != end && *next != ','))
      throw error("cuts '" + text + "': expected comma-separated block indices, e.g. 4 or 4,7");
    cuts.push_back(v);
    p = next == end ? end : next + 1;
  }
  if (cuts.empty()) throw error("cuts '" + text + "': empty");
  return cuts;
}

}  // namespace cleave::core
