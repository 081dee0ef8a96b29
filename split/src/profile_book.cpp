// Profiles and link measurements -> the splitter's cost-model problem; the book as text fields
// and back.
#include "cleave/split/profile_book.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <type_traits>

#include "cleave/core/error.h"

namespace cleave::split {

namespace {

std::string name_of(node_key k) {
  if (k.role == core::tier::server) return "the server";
  return std::string(core::tier_name(k.role)) + " " + std::to_string(k.id);
}

// "device:2"
std::string text_of(node_key k) {
  return std::string(core::tier_name(k.role)) + ":" + std::to_string(k.id);
}

// The shortest text that reads back to the same value.
template <class T>
std::string figure(T v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// A whole token as a number (floating figures finite and non-negative); throws naming `field`.
template <class T>
T number(std::string_view text, const std::string& field) {
  T v{};
  const char* const end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, v);
  if (r.ec != std::errc{} || r.ptr != end || text.empty())
    throw core::error(field + ": '" + std::string(text) + "' is not a number");
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(v) || v < 0)
      throw core::error(field + ": " + std::string(text) + " is not a finite, non-negative figure");
  return v;
}

// The parts of s between separators, empty ones dropped (sep ' ' also drops repeated spaces).
std::vector<std::string_view> parts(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (std::size_t at = 0; at <= s.size();) {
    std::size_t next = s.find(sep, at);
    if (next == std::string_view::npos) next = s.size();
    std::string_view p = s.substr(at, next - at);
    while (!p.empty() && p.front() == ' ') p.remove_prefix(1);
    while (!p.empty() && p.back() == ' ') p.remove_suffix(1);
    if (!p.empty()) out.push_back(p);
    at = next + 1;
  }
  return out;
}

node_key node_of(std::string_view text, const std::string& field) {
  const auto colon = text.find(':');
  const auto role = core::tier_from_name(text.substr(0, colon));
  if (colon == std::string_view::npos || !role)
    throw core::error(field + ": '" + std::string(text) + "' is not a node (such as device:2)");
  return {*role, number<std::uint32_t>(text.substr(colon + 1), field)};
}

}  // namespace

profile_book::profile_book(const core::model_spec& m, int micro_batch, int n_micro_batches, bool u_shape)
    : m_(&m), micro_batch_(micro_batch), n_micro_batches_(n_micro_batches), u_shape_(u_shape) {}

void profile_book::set_profile(node_key node, node_profile p) {
  if (static_cast<int>(p.blocks.size()) != m_->n_blocks())
    throw core::error("profile of " + name_of(node) + " has " + std::to_string(p.blocks.size()) + " blocks, not " +
                      std::to_string(m_->n_blocks()));
  if (p.batch == 0) throw core::error("profile of " + name_of(node) + " was timed on an empty batch");
  profiles_[node] = std::move(p);
}

std::vector<profile_book::link_measurement> profile_book::links() const {
  std::vector<link_measurement> out;
  for (const auto& [ends, m] : links_) out.push_back({ends.first, ends.second, m.rtt_seconds, m.bytes_per_second});
  return out;
}

void profile_book::report_link(node_key from, node_key to, double rtt_seconds, double bytes_per_second) {
  auto& m = links_[{from, to}];
  if (rtt_seconds > 0) m.rtt_seconds = rtt_seconds;
  if (bytes_per_second > 0) m.bytes_per_second = bytes_per_second;
}

void profile_book::write(std::map<std::string, std::string>& meta, std::string_view prefix) const {
  const std::string pre(prefix);
  for (const auto& [k, p] : profiles_) {
    const std::string stem = pre + "profile:" + text_of(k) + ":";
    meta[stem + "node_id"] = std::to_string(p.node_id);
    meta[stem + "batch"] = std::to_string(p.batch);
    meta[stem + "backend"] = p.backend;
    meta[stem + "memory_budget"] = std::to_string(p.memory_budget_bytes);
    std::string blocks, links;
    for (const auto& b : p.blocks)
      blocks += (blocks.empty() ? "" : "; ") + figure(b.forward_seconds) + " " + figure(b.backward_seconds) + " " +
                std::to_string(b.param_bytes) + " " + std::to_string(b.state_bytes) + " " +
                std::to_string(b.saved_bytes) + " " + std::to_string(b.output_bytes);
    for (const auto& l : p.links)
      links += (links.empty() ? "" : "; ") + std::to_string(l.peer_id) + " " + figure(l.rtt_us) + " " +
               figure(l.bandwidth_bytes_per_s);
    meta[stem + "blocks"] = blocks;
    meta[stem + "links"] = links;
  }
  for (const auto& [ends, m] : links_)
    meta[pre + "link:" + text_of(ends.first) + ">" + text_of(ends.second)] =
        figure(m.rtt_seconds) + " " + figure(m.bytes_per_second);
}

void profile_book::read(const std::map<std::string, std::string>& meta, std::string_view prefix) {
  profile_book out(*m_, micro_batch_, n_micro_batches_, u_shape_);
  const std::string pp = std::string(prefix) + "profile:", lp = std::string(prefix) + "link:";
  std::map<node_key, std::map<std::string, const std::string*>> fields;  // node -> field -> value
  for (auto it = meta.lower_bound(std::string(prefix)); it != meta.end() && it->first.starts_with(prefix); ++it) {
    const std::string& key = it->first;
    const std::string_view k(key);
    if (k.starts_with(pp)) {
      const std::string_view rest = k.substr(pp.size());
      const auto colon = rest.rfind(':');
      if (colon == std::string_view::npos) throw core::error(key + ": not a profile field");
      fields[node_of(rest.substr(0, colon), key)][std::string(rest.substr(colon + 1))] = &it->second;
    } else if (k.starts_with(lp)) {
      const std::string_view rest = k.substr(lp.size());
      const auto gt = rest.find('>');
      if (gt == std::string_view::npos) throw core::error(key + ": not a link (such as device:2>server:0)");
      const auto v = parts(it->second, ' ');
      if (v.size() != 2) throw core::error(key + ": '" + it->second + "' is not 'rtt_seconds bytes_per_second'");
      out.links_[{node_of(rest.substr(0, gt), key), node_of(rest.substr(gt + 1), key)}] = {number<double>(v[0], key),
                                                                                           number<double>(v[1], key)};
    } else {
      throw core::error(key + ": not a field of the splitter's book");
    }
  }
  for (auto& [node, f] : fields) {
    const std::string stem = pp + text_of(node);
    const auto take = [&, &f = f](const std::string& name) -> const std::string& {
      const auto it = f.find(name);
      if (it == f.end()) throw core::error(stem + ":" + name + " is missing");
      const std::string& v = *it->second;
      f.erase(it);
      return v;
    };
    node_profile p;
    p.node_id = number<std::uint32_t>(take("node_id"), stem + ":node_id");
    p.batch = number<std::uint32_t>(take("batch"), stem + ":batch");
    p.backend = take("backend");
    p.memory_budget_bytes = number<std::uint64_t>(take("memory_budget"), stem + ":memory_budget");
    const std::string bf = stem + ":blocks";
    for (const auto rec : parts(take("blocks"), ';')) {
      const auto v = parts(rec, ' ');
      const std::string at = bf + " (block " + std::to_string(p.blocks.size()) + ")";
      if (v.size() != 6) throw core::error(at + ": " + std::to_string(v.size()) + " figures, not 6");
      p.blocks.push_back({number<double>(v[0], at), number<double>(v[1], at), number<std::uint64_t>(v[2], at),
                          number<std::uint64_t>(v[3], at), number<std::uint64_t>(v[4], at),
                          number<std::uint64_t>(v[5], at)});
    }
    const std::string lf = stem + ":links";
    for (const auto rec : parts(take("links"), ';')) {
      const auto v = parts(rec, ' ');
      const std::string at = lf + " (link " + std::to_string(p.links.size()) + ")";
      if (v.size() != 3) throw core::error(at + ": " + std::to_string(v.size()) + " figures, not 3");
      p.links.push_back({number<std::uint32_t>(v[0], at), number<float>(v[1], at), number<float>(v[2], at)});
    }
    if (!f.empty()) throw core::error(stem + ":" + f.begin()->first + ": not a profile field");
    try {
      out.set_profile(node, std::move(p));
    } catch (const core::error& e) {
      throw core::error(stem + ": " + e.what());
    }
  }
  *this = std::move(out);
}

namespace {

// A link whose bandwidth neither end has measured yet is not priced as free: no plan until it is.
bool measured(const link_costs& l, node_key a, node_key b, std::string& missing) {
  if (l.bytes_per_second > 0) return true;
  missing = "a bandwidth of the link " + name_of(a) + " - " + name_of(b);
  return false;
}

}  // namespace

link_costs profile_book::link_of(node_key a, node_key b) const {
  // Both ends' views: the slower measured direction and the longer round trip.
  link_costs l;
  for (const auto& key : {std::pair{a, b}, std::pair{b, a}}) {
    const auto it = links_.find(key);
    if (it == links_.end()) continue;
    const auto& m = it->second;
    if (m.bytes_per_second > 0)
      l.bytes_per_second =
          l.bytes_per_second > 0 ? std::min(l.bytes_per_second, m.bytes_per_second) : m.bytes_per_second;
    l.rtt_seconds = std::max(l.rtt_seconds, m.rtt_seconds);
  }
  return l;
}

node_costs profile_book::costs_of(const node_profile& p) const {
  // Profiled per micro-batch of p.batch samples; a step is n_micro_batches of micro_batch_.
  const double scale = static_cast<double>(micro_batch_) / p.batch * n_micro_batches_;
  node_costs c;
  for (const auto& b : p.blocks) {
    c.block_seconds.push_back((b.forward_seconds + b.backward_seconds) * scale);
    c.forward_seconds.push_back(b.forward_seconds * scale);  // <= the block's: both round the same way up
  }
  c.memory_budget = static_cast<double>(p.memory_budget_bytes);
  return c;
}

std::optional<split_problem> profile_book::problem(const std::vector<device_entry>& devices,
                                                   std::string& missing) const {
  const node_key server{core::tier::server, 0};
  const auto sp = profiles_.find(server);
  if (sp == profiles_.end()) {
    missing = "the profile of " + name_of(server);
    return std::nullopt;
  }
  split_problem p;
  p.n_blocks = m_->n_blocks();
  p.u_shape = u_shape_;
  p.n_micro_batches = n_micro_batches_;
  p.batch = micro_batch_ * n_micro_batches_;
  const double batch = static_cast<double>(micro_batch_) * n_micro_batches_;
  // Bytes are the model's, whoever measured them: the server's profile gives them.
  p.cut_bytes.push_back(static_cast<double>(m_->input.numel()) * 4.0 * batch);
  for (const auto& b : sp->second.blocks) {
    p.cut_bytes.push_back(static_cast<double>(b.output_bytes) * batch);
    p.fixed_bytes.push_back(static_cast<double>(b.param_bytes + b.state_bytes));
    p.saved_bytes.push_back(static_cast<double>(b.saved_bytes) * batch);
  }
  p.server = costs_of(sp->second);
  std::map<std::uint32_t, int> edge_index;
  for (const auto& d : devices) {
    const node_key dk{core::tier::device, d.id};
    const auto dp = profiles_.find(dk);
    if (dp == profiles_.end()) {
      missing = "the profile of " + name_of(dk);
      return std::nullopt;
    }
    device_costs dc;
    dc.board = costs_of(dp->second);
    if (d.behind_edge) {
      const node_key ek{core::tier::edge, d.edge};
      auto it = edge_index.find(d.edge);
      if (it == edge_index.end()) {
        const auto ep = profiles_.find(ek);
        if (ep == profiles_.end()) {
          missing = "the profile of " + name_of(ek);
          return std::nullopt;
        }
        it = edge_index.emplace(d.edge, static_cast<int>(p.edges.size())).first;
        p.edges.push_back(costs_of(ep->second));
        p.edge_links.push_back(link_of(ek, server));
        if (!measured(p.edge_links.back(), ek, server, missing)) return std::nullopt;
      }
      dc.edge = it->second;
      dc.link = link_of(dk, ek);
      if (!measured(dc.link, dk, ek, missing)) return std::nullopt;
    } else {
      dc.link = link_of(dk, server);
      if (!measured(dc.link, dk, server, missing)) return std::nullopt;
    }
    p.devices.push_back(std::move(dc));
  }
  return p;
}

}  // namespace cleave::split
