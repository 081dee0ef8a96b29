// The edge's part in a round's aggregation: each device's upload checked against its plan and
// held, then at the flush sent up per device or pre-averaged with the edge's own replicas; devices
// gone silent are not waited for.
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <set>

#include "cleave/split/aggregate.h"
#include "edge_impl.h"

namespace cleave::edge {

void edge_node::impl::on_replica(device_state& d, const wire::ReplicaUpload& r) {
  const auto devs = protocol::devices_of(r);
  const std::uint32_t id = d.s->id;
  if (devs.size() != 1 || devs[0] != id) throw core::error("a device may only upload its own replicas");
  if (!collecting_ || flushing_ || r.round() != round_ || r.attempt() != attempt_ || !d.expected) return;
  try {
    // The route in force now: a device that cut over during the round sent its Cutover first.
    uploads_.add(d.s.get(), core::tier::device, devs, {d.rs.route}, r, protocol::replica_weights_of(r, model_));
  } catch (const core::error& e) {
    // Counted out of the round here: nothing of it goes up.
    d.parts.clear();
    uploads_.forget(id);
    throw core::error("device " + std::to_string(id) + ": replica of round " + std::to_string(round_) +
                      " refused: " + e.what());
  }
  if (!r.final_part()) return;
  d.parts = uploads_.complete(d.s.get(), core::tier::device, devs);
  d.n_samples = r.n_samples();
  arrived_.push_back(id);
  maybe_flush(false);
}

asio::awaitable<void> edge_node::impl::count_out_silent(std::uint64_t turn) {
  asio::steady_timer timer(ex_.io());
  while (collecting_ && !flushing_ && turn_ == turn) {
    const auto now = clock::now();
    auto next = clock::time_point::max();
    bool counted = false;
    for (auto& [id, d] : devices_) {
      if (!d.expected || uploads_.is_done(id)) continue;
      if (now - d.heard < silence_) {
        next = std::min(next, d.heard + silence_);
        continue;
      }
      d.expected = false;
      counted = true;
      spdlog::warn("edge {}: round {}: nothing from device {} for {:.1f} s (a quarter of the deadline); counted out",
                   c_.id, round_, id, std::chrono::duration<double>(silence_).count());
    }
    if (counted) maybe_flush(false);
    if (next == clock::time_point::max()) co_return;
    timer.expires_at(next);
    co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }
}

void edge_node::impl::maybe_flush(bool deadline) {
  if (!collecting_ || flushing_) return;
  std::vector<std::uint32_t> done;
  for (auto& [id, d] : devices_) {
    if (!d.expected) continue;
    if (uploads_.is_done(id))
      done.push_back(id);
    else if (d.s && !deadline)
      return;  // still training
  }
  flushing_ = true;
  ex_.spawn(flush(std::move(done), turn_), "averaging a round");
}

asio::awaitable<void> edge_node::impl::flush(std::vector<std::uint32_t> done, std::uint64_t turn) {
  // This edge's own replicas of the devices that finished join their uploads.
  std::vector<std::pair<std::uint32_t, split::route>> own;
  for (auto id : done) own.emplace_back(id, devices_.at(id).rs.route);
  auto take = [this, own] {
    std::pair<std::vector<std::vector<runtime::segment_runner::replica>>, double> t;
    for (const auto& [id, r] : own) t.first.push_back(runner_->replicas(id, r));
    t.second = runner_->take_compute_seconds();
    return t;
  };
  auto [mine, compute] = co_await ex_.compute(std::move(take));
  if (turn != turn_ || !collecting_) co_return;  // a newer round or turn started meanwhile
  const std::uint64_t bytes = below_->bytes_moved();
  const auto parts = per_device_ ? device_parts(done, mine) : pre_average(done, mine);
  // The blocks first; then the statistics, which close the upload and name the devices it completes.
  protocol::replica_desc d;
  d.round = round_;
  d.attempt = attempt_;
  d.node_id = c_.id;
  d.final_part = false;
  for (const upload_part& p : parts) {
    d.devices = p.devices;
    d.first_block = static_cast<std::uint32_t>(p.first);
    d.end_block = static_cast<std::uint32_t>(p.end);
    d.n_samples = p.n_samples;
    up_->post(protocol::make_replica_upload(d, p.params, p.buffers));
  }
  d.devices = done;
  d.first_block = d.end_block = 0;
  d.n_samples = 0;
  d.final_part = true;
  d.stats = uploads_.tally().as_stats(compute, bytes - std::min(bytes, bytes_mark_));
  up_->post(protocol::make_replica_upload(d, std::span<const float>{}, std::span<const float>{}));
  collecting_ = false;
}

std::vector<edge_node::impl::upload_part> edge_node::impl::device_parts(const std::vector<std::uint32_t>& done,
                                                                        replica_sets& mine) {
  // Each device's own replicas, its upload and this edge's, each part naming that device only.
  std::vector<upload_part> parts;
  for (std::size_t i = 0; i < done.size(); ++i) {
    auto& d = devices_.at(done[i]);
    for (auto& h : d.parts)
      parts.push_back({{done[i]}, h.first, h.end, d.n_samples, std::move(h.params), std::move(h.buffers)});
    for (auto& rep : mine[i])
      parts.push_back({{done[i]}, rep.first, rep.end, d.n_samples, std::move(rep.params), std::move(rep.buffers)});
  }
  return parts;
}

std::vector<edge_node::impl::upload_part> edge_node::impl::pre_average(const std::vector<std::uint32_t>& done,
                                                                       const replica_sets& mine) {
  // One pre-average: the devices' uploads in the order they came, then this edge's replicas;
  // each block remembers the devices behind it.
  split::model_average avg(model_);
  std::vector<std::set<std::uint32_t>> behind(static_cast<std::size_t>(model_.n_blocks()));
  const auto add = [&](std::uint32_t id, int first, int end, double weight, const auto& params, const auto& buffers) {
    avg.add(first, end, weight, params, buffers);
    for (int b = first; b < end; ++b) behind[static_cast<std::size_t>(b)].insert(id);
  };
  const std::set<std::uint32_t> in(done.begin(), done.end());
  for (auto id : arrived_)
    if (in.count(id))
      for (const auto& h : devices_.at(id).parts)
        if (h.weight > 0) add(id, h.first, h.end, h.weight, h.params, h.buffers);
  for (std::size_t i = 0; i < done.size(); ++i)
    for (const auto& rep : mine[i])
      add(done[i], rep.first, rep.end, static_cast<double>(devices_.at(done[i]).n_samples), rep.params, rep.buffers);
  // One part per run of blocks with one weight and the same devices behind them, naming those
  // devices only: a device whose blocks moved onto it during the round is not named for blocks
  // this edge no longer holds for it (under secure aggregation they are its own, masked).
  std::vector<upload_part> parts;
  for (const auto& run : avg.runs())
    for (int b = run.first; b < run.end;) {
      int e = b + 1;
      while (e < run.end && behind[static_cast<std::size_t>(e)] == behind[static_cast<std::size_t>(b)]) ++e;
      const auto& who = behind[static_cast<std::size_t>(b)];
      upload_part& p =
          parts.emplace_back(upload_part{{who.begin(), who.end()}, b, e, static_cast<std::uint64_t>(run.weight)});
      avg.mean(b, e, p.params, p.buffers);
      b = e;
    }
  return parts;
}

}  // namespace cleave::edge
