// Checks of the splitter's inputs: problems, routes and route choices (see splitter.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cleave/core/error.h"
#include "cost_terms.h"

namespace cleave::split {

using namespace detail;

namespace {

void check_finite(double v, const std::string& what) {
  if (!std::isfinite(v) || v < 0)
    throw core::error("split problem: " + what + " is " + fmt::format("{}", v) + " (must be finite and >= 0)");
}

void check_values(const std::vector<double>& v, std::size_t want, const std::string& what) {
  if (v.size() != want)
    throw core::error("split problem: " + what + " has " + std::to_string(v.size()) + " entries, expected " +
                      std::to_string(want));
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]) || v[i] < 0) check_finite(v[i], what + "[" + std::to_string(i) + "]");
}

void check_link(const link_costs& l, const std::string& what) {
  check_finite(l.bytes_per_second, what + ".bytes_per_second");
  check_finite(l.rtt_seconds, what + ".rtt_seconds");
}

void check_node(const node_costs& nc, std::size_t n, const std::string& what) {
  check_values(nc.block_seconds, n, what + "block_seconds");
  check_finite(nc.memory_budget, what + "memory_budget");
  if (nc.forward_seconds.empty()) return;  // a third of each block (splitter.h)
  check_values(nc.forward_seconds, n, what + "forward_seconds");
  for (std::size_t i = 0; i < n; ++i)
    if (nc.forward_seconds[i] > nc.block_seconds[i])
      throw core::error("split problem: " + what + "forward_seconds[" + std::to_string(i) + "] is " +
                        fmt::format("{}", nc.forward_seconds[i]) + ", above block_seconds[" + std::to_string(i) + "] " +
                        fmt::format("{}", nc.block_seconds[i]) + " (the forward is part of the block's time)");
}

void check_device_index(const split_problem& p, int d) {
  if (d < 0 || static_cast<std::size_t>(d) >= p.devices.size())
    throw core::error("split problem: device " + std::to_string(d) + " out of range (" +
                      std::to_string(p.devices.size()) + " devices)");
}

// A micro-batch count `what` (a field name) must be >= 1 and divide the batch when one is given.
void check_micro_batches(const split_problem& p, int m, const std::string& what) {
  if (m < 1) throw core::error("split problem: " + what + " is " + std::to_string(m) + ", needs at least 1");
  if (p.batch > 0 && p.batch % m != 0)
    throw core::error("split problem: " + what + " is " + std::to_string(m) + ", does not divide batch " +
                      std::to_string(p.batch));
}

void check_step_shape(const split_problem& p) {
  if (p.batch < 0) throw core::error("split problem: batch is " + std::to_string(p.batch) + " (must be >= 0)");
  check_micro_batches(p, p.n_micro_batches, "n_micro_batches");
  const auto& o = p.micro_batch_options;
  for (std::size_t i = 0; i < o.size(); ++i) {
    const std::string what = "micro_batch_options[" + std::to_string(i) + "]";
    check_micro_batches(p, o[i], what);
    if (std::find(o.begin(), o.begin() + static_cast<std::ptrdiff_t>(i), o[i]) !=
        o.begin() + static_cast<std::ptrdiff_t>(i))
      throw core::error("split problem: " + what + " is " + std::to_string(o[i]) + ", listed twice");
  }
  // A device holds at most n blocks at the bottom (n - 1 in U-shape, where its top holds one).
  const int most = p.u_shape ? p.n_blocks - 1 : p.n_blocks;
  if (p.min_device_blocks < 0 || p.min_device_blocks > most)
    throw core::error("split problem: min_device_blocks is " + std::to_string(p.min_device_blocks) +
                      " (must be in [0, " + std::to_string(most) + "])");
}

void check_codecs(const split_problem& p) {
  if (!p.cut_channels.empty()) check_values(p.cut_channels, static_cast<std::size_t>(p.n_blocks) + 1, "cut_channels");
  if (!(p.topk_fraction > 0.0f && p.topk_fraction <= 1.0f))
    throw core::error("split problem: topk_fraction is " + fmt::format("{}", p.topk_fraction) + " (must be in (0, 1])");
  bool activations = p.codecs.empty();
  for (std::size_t i = 0; i < p.codecs.size(); ++i) {
    const std::string what = "codecs[" + std::to_string(i) + "]";
    const auto id = p.codecs[i].id;
    if (!core::codec_from_int(static_cast<std::uint32_t>(id)))
      throw core::error("split problem: " + what + " has codec id " + std::to_string(static_cast<int>(id)) +
                        ", not a codec");
    for (std::size_t j = 0; j < i; ++j)
      if (p.codecs[j].id == id)
        throw core::error("split problem: " + what + " is " + std::string(core::codec_name(id)) + ", listed twice");
    check_finite(p.codecs[i].seconds_per_value, what + ".seconds_per_value");
    activations = activations || core::codec_for_activations(id);
  }
  if (!activations)
    throw core::error("split problem: codecs has no codec for activations (topk is for gradients only)");
}

}  // namespace

void validate(const split_problem& p) {
  if (p.n_blocks < 1)
    throw core::error("split problem: n_blocks is " + std::to_string(p.n_blocks) + ", needs at least 1");
  if (p.u_shape && p.n_blocks < 2)
    throw core::error(
        "split problem: u_shape needs at least 2 blocks (the device holds the first and the last), n_blocks is " +
        std::to_string(p.n_blocks));
  check_step_shape(p);
  const std::size_t n = static_cast<std::size_t>(p.n_blocks);
  check_values(p.cut_bytes, n + 1, "cut_bytes");
  check_values(p.fixed_bytes, n, "fixed_bytes");
  check_values(p.saved_bytes, n, "saved_bytes");
  check_codecs(p);
  check_node(p.server, n, "server.");
  for (std::size_t e = 0; e < p.edges.size(); ++e) check_node(p.edges[e], n, "edge " + std::to_string(e) + ": ");
  if (p.edge_links.size() != p.edges.size())
    throw core::error("split problem: edge_links has " + std::to_string(p.edge_links.size()) + " entries, expected " +
                      std::to_string(p.edges.size()) + " (one per edge)");
  for (std::size_t e = 0; e < p.edge_links.size(); ++e)
    check_link(p.edge_links[e], "edge_links[" + std::to_string(e) + "]");
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const auto& dev = p.devices[d];
    const std::string what = "device " + std::to_string(d) + ": ";
    check_node(dev.board, n, what + "board.");
    if (dev.edge < -1 || dev.edge >= static_cast<int>(p.edges.size()))
      throw core::error("split problem: " + what + "edge " + std::to_string(dev.edge) + " out of range (" +
                        std::to_string(p.edges.size()) + " edges)");
    check_link(dev.link, what + "link");
  }
}

std::vector<core::tier> path_of(const split_problem& p, int device) {
  check_device_index(p, device);
  const bool edge = dev_of(p, device).edge >= 0;
  if (p.u_shape)
    return edge ? std::vector{core::tier::device, core::tier::edge, core::tier::server, core::tier::edge,
                              core::tier::device}
                : std::vector{core::tier::device, core::tier::server, core::tier::device};
  return edge ? std::vector{core::tier::device, core::tier::edge, core::tier::server}
              : std::vector{core::tier::device, core::tier::server};
}

route_choice default_choice(const split_problem& p, std::size_t n_hops) {
  return route_choice{p.n_micro_batches, std::vector<core::hop_codecs>(n_hops)};
}

namespace detail {

const codec_option* find_codec(const split_problem& p, core::codec c) {
  static const codec_option free_f32{};
  for (const auto& o : p.codecs)
    if (o.id == c) return &o;
  return c == core::codec::f32 ? &free_f32 : nullptr;
}

void check_route(const split_problem& p, int d, const route& r) {
  const auto want = path_of(p, d);
  if (r.path != want) {
    auto names = [](const std::vector<core::tier>& path) {
      std::string s;
      for (auto t : path) s += (s.empty() ? "" : " ") + std::string(core::tier_name(t));
      return s;
    };
    throw core::error("route for device " + std::to_string(d) + ": path '" + names(r.path) + "', expected '" +
                      names(want) + "'");
  }
  if (r.n_blocks != p.n_blocks)
    throw core::error("route for device " + std::to_string(d) + ": " + std::to_string(r.n_blocks) +
                      " blocks, the model has " + std::to_string(p.n_blocks));
  try {
    make_route(p.u_shape, dev_of(p, d).edge >= 0, r.cuts, p.n_blocks);
  } catch (const core::error& e) {
    throw core::error("route for device " + std::to_string(d) + ": " + e.what());
  }
}

void check_choice(const split_problem& p, int d, const route& r, const route_choice& c) {
  const std::string what = "route choice for device " + std::to_string(d) + ": ";
  if (c.n_micro_batches < 1 || (p.batch > 0 && p.batch % c.n_micro_batches != 0))
    throw core::error(
        what + "n_micro_batches is " + std::to_string(c.n_micro_batches) +
        (c.n_micro_batches < 1 ? ", needs at least 1" : ", does not divide batch " + std::to_string(p.batch)));
  if (c.hops.size() + 1 != r.path.size())
    throw core::error(what + "hops has " + std::to_string(c.hops.size()) + " entries, the route has " +
                      std::to_string(r.path.size() - 1) + " hops");
  for (std::size_t k = 0; k < c.hops.size(); ++k) {
    const std::string hop = what + "hops[" + std::to_string(k) + "].";
    for (const auto& [dir, id] : {std::pair{"up", c.hops[k].up}, std::pair{"down", c.hops[k].down}}) {
      if (!find_codec(p, id))
        throw core::error(hop + dir + " is codec " + std::to_string(static_cast<int>(id)) +
                          ", not among the problem's codecs");
      if (std::string_view(dir) == "up" && !core::codec_for_activations(id))
        throw core::error(hop + "up is " + std::string(core::codec_name(id)) + ", which is for gradients only");
    }
  }
}

}  // namespace detail

}  // namespace cleave::split
