// Profiles and link measurements -> the splitter's cost-model problem.
#include "cleave/split/profile_book.h"

#include <algorithm>

#include "cleave/core/error.h"

namespace cleave::split {

namespace {

std::string name_of(node_key k) {
  if (k.role == core::tier::server) return "the server";
  return std::string(core::tier_name(k.role)) + " " + std::to_string(k.id);
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
  for (const auto& b : p.blocks) c.block_seconds.push_back((b.forward_seconds + b.backward_seconds) * scale);
  c.memory_budget = static_cast<double>(p.memory_budget_bytes);
  return c;
}

std::optional<split_problem> profile_book::problem(const std::vector<device_entry>& devices,
                                                   std::string& missing) const {
  const node_key server{core::tier::server, 0};
  const auto sp = profiles_.find(server);
  if (sp == profiles_.end()) {
    missing = name_of(server);
    return std::nullopt;
  }
  split_problem p;
  p.n_blocks = m_->n_blocks();
  p.u_shape = u_shape_;
  p.n_micro_batches = n_micro_batches_;
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
      missing = name_of(dk);
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
          missing = name_of(ek);
          return std::nullopt;
        }
        it = edge_index.emplace(d.edge, static_cast<int>(p.edges.size())).first;
        p.edges.push_back(costs_of(ep->second));
        p.edge_links.push_back(link_of(ek, server));
      }
      dc.edge = it->second;
      dc.link = link_of(dk, ek);
    } else {
      dc.link = link_of(dk, server);
    }
    p.devices.push_back(std::move(dc));
  }
  return p;
}

}  // namespace cleave::split
