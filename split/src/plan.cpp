// Routes and plans.
#include "cleave/split/plan.h"

#include <algorithm>
#include <charconv>

#include "cleave/core/error.h"

namespace cleave::split {

bool route::has_edge() const {
  for (auto t : path)
    if (t == core::tier::edge) return true;
  return false;
}

std::vector<int> route::segments_on(core::tier t) const {
  std::vector<int> out;
  for (int i = 0; i < n_segments(); ++i)
    if (path[static_cast<std::size_t>(i)] == t) out.push_back(i);
  return out;
}

std::string route::str() const {
  std::string s;
  for (int i = 0; i < n_segments(); ++i) {
    if (i) s += " ";
    s += std::string(core::tier_name(path[static_cast<std::size_t>(i)])) + "[" + std::to_string(begin(i)) + "," +
         std::to_string(end(i)) + ")";
  }
  return s;
}

route make_route(bool u_shape, bool with_edge, const std::vector<int>& cuts, int n_blocks) {
  route r;
  r.n_blocks = n_blocks;
  if (u_shape)
    r.path = with_edge ? std::vector{core::tier::device, core::tier::edge, core::tier::server, core::tier::edge,
                                     core::tier::device}
                       : std::vector{core::tier::device, core::tier::server, core::tier::device};
  else
    r.path = with_edge ? std::vector{core::tier::device, core::tier::edge, core::tier::server}
                       : std::vector{core::tier::device, core::tier::server};
  const std::size_t want = r.path.size() - 1;
  const std::string what = std::string(u_shape ? "U-shaped " : "") + (with_edge ? "3-tier" : "2-tier") + " plan";
  if (cuts.size() != want)
    throw core::error(what + " needs " + std::to_string(want) + " cut" + (want > 1 ? "s" : "") + ", got " +
                      std::to_string(cuts.size()));
  int prev = 0;
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    if (cuts[i] < prev || cuts[i] > n_blocks)
      throw core::error(what + ": cut " + std::to_string(cuts[i]) + " out of order or outside [0, " +
                        std::to_string(n_blocks) + "]");
    prev = cuts[i];
  }
  r.cuts = cuts;
  if (r.end(0) < 1)
    throw core::error(what + ": the device must hold at least the first block (raw inputs never leave it)");
  if (u_shape && r.begin(r.n_segments() - 1) >= n_blocks)
    throw core::error(what + ": the device must hold at least the last block (labels never leave it)");
  return r;
}

route parse_route(const std::string& text, int n_blocks) {
  const auto bad = [&](const std::string& why) { return core::error("route '" + text + "': " + why); };
  std::vector<core::tier> path;
  std::vector<int> ends;
  const char* p = text.data();
  const char* const end = p + text.size();
  while (p < end) {
    if (!path.empty()) {
      if (*p != ' ') throw bad("segments must be separated by one space");
      ++p;
    }
    const char* open = std::find(p, end, '[');
    const auto t = core::tier_from_name(std::string_view(p, static_cast<std::size_t>(open - p)));
    if (open == end || !t) throw bad("expected a segment such as device[0,4)");
    int first = 0, last = 0;
    auto r = std::from_chars(open + 1, end, first);
    if (r.ec == std::errc{} && r.ptr < end && *r.ptr == ',') r = std::from_chars(r.ptr + 1, end, last);
    if (r.ec != std::errc{} || r.ptr == end || *r.ptr != ')') throw bad("expected a segment such as device[0,4)");
    if (first != (ends.empty() ? 0 : ends.back()))
      throw bad("segment " + std::to_string(path.size()) + " starts at block " + std::to_string(first) +
                ", not where the one before it ends");
    path.push_back(*t);
    ends.push_back(last);
    p = r.ptr + 1;
  }
  if (path.size() < 2) throw bad("a route has at least two segments");
  if (ends.back() != n_blocks)
    throw bad("it ends at block " + std::to_string(ends.back()) + ", the model has " + std::to_string(n_blocks));
  const bool u_shape = path.back() == core::tier::device;
  const bool with_edge = std::find(path.begin(), path.end(), core::tier::edge) != path.end();
  ends.pop_back();
  route r;
  try {
    r = make_route(u_shape, with_edge, ends, n_blocks);
  } catch (const core::error& e) {
    throw bad(e.what());
  }
  if (r.path != path) throw bad("its tiers are not those of a route cleave runs");
  return r;
}

core::tier tier_of_block(const route& r, int block) {
  for (int s = 0; s < r.n_segments(); ++s)
    if (r.begin(s) <= block && block < r.end(s)) return r.path[static_cast<std::size_t>(s)];
  throw core::error("block " + std::to_string(block) + " is outside the route " + r.str());
}

std::vector<int> parse_cuts(const std::string& text) {
  std::vector<int> cuts;
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    int v = 0;
    const auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc{} || (next != end && *next != ','))
      throw core::error("cuts '" + text + "': expected comma-separated block indices, e.g. 4 or 4,7");
    cuts.push_back(v);
    p = next == end ? end : next + 1;
  }
  if (cuts.empty()) throw core::error("cuts '" + text + "': empty");
  return cuts;
}

std::string cuts_text(const std::vector<int>& cuts) {
  std::string s;
  for (const int c : cuts) s += (s.empty() ? "" : ",") + std::to_string(c);
  return s;
}

namespace {

int smallest_output_cut(const core::model_spec& m, int lo, int hi) {
  int best = lo;
  for (int k = lo; k <= hi; ++k)
    if (m.blocks[static_cast<std::size_t>(k - 1)].out.numel() <
        m.blocks[static_cast<std::size_t>(best - 1)].out.numel())
      best = k;
  return best;
}

}  // namespace

std::vector<int> default_cuts(const core::model_spec& m, bool u_shape, bool with_edge) {
  const int n = m.n_blocks();
  const int top = u_shape ? n - 1 : n;  // blocks below the device's top
  std::vector<int> cuts;
  if (with_edge) {
    const int c1 = smallest_output_cut(m, 1, std::max(1, top / 3));
    const int c2 = smallest_output_cut(m, std::min(top, c1 + 1), std::max(c1 + 1, std::min(top, 2 * top / 3)));
    cuts = {c1, std::min(c2, top)};
  } else {
    cuts = {smallest_output_cut(m, 1, std::max(1, top / 2))};
  }
  if (u_shape) {
    cuts.push_back(top);
    if (with_edge) cuts.push_back(top);
  }
  return cuts;
}

route configured_route(const core::model_spec& m, bool u_shape, bool with_edge, const std::vector<int>& cuts) {
  return make_route(u_shape, with_edge, cuts.empty() ? default_cuts(m, u_shape, with_edge) : cuts, m.n_blocks());
}

std::vector<std::pair<int, int>> device_blocks(const std::vector<route>& routes, int min_holders) {
  std::vector<int> holders;
  for (const auto& r : routes) {
    holders.resize(static_cast<std::size_t>(std::max<int>(r.n_blocks, static_cast<int>(holders.size()))), 0);
    for (int seg : r.segments_on(core::tier::device))
      for (int b = r.begin(seg); b < r.end(seg); ++b) ++holders[static_cast<std::size_t>(b)];
  }
  std::vector<std::pair<int, int>> ranges;
  for (int b = 0; b < static_cast<int>(holders.size()); ++b)
    if (holders[static_cast<std::size_t>(b)] >= std::max(1, min_holders)) {
      if (!ranges.empty() && ranges.back().second == b)
        ++ranges.back().second;
      else
        ranges.emplace_back(b, b + 1);
    }
  return ranges;
}

std::string ranges_text(const std::vector<std::pair<int, int>>& ranges) {
  std::string s;
  for (const auto& [f, e] : ranges) s += (s.empty() ? "[" : " [") + std::to_string(f) + "," + std::to_string(e) + ")";
  return s;
}

}  // namespace cleave::split
