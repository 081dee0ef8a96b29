// Secure aggregation of the device replicas (privacy/secagg.h) as the server drives it: keys ->
// roster, shares forwarded between devices, after training the mask set, masked uploads, the
// unmask request, the revealed shares, and the unmasked sum into the round's aggregate.
#include <algorithm>

#include "cleave/privacy/masked_replica.h"
#include "server_impl.h"

namespace cleave::server {

void server_node::impl::post_secagg(std::uint32_t device, const protocol::secagg_desc& d) {
  const auto it = devices_.find(device);
  if (it != devices_.end() && it->second.connected) it->second.via->post(protocol::make_secagg(d));
}

void server_node::impl::on_secagg(const runtime::session_ptr& s, const wire::SecAgg& m) {
  const std::uint32_t dev = m.device_id();
  if (!attached(dev, s, "secure aggregation message")) return;
  auto& sec = round_.secure;
  if (!c_.secure_aggregation) throw core::error("a secure aggregation message, but this server does not use it");
  // Its phases run while the round collects and, after training, before it closes.
  if ((round_.at != phase::collecting && round_.at != phase::closing) || m.round() != round_.number ||
      !round_.members.count(dev) || sec.unmasked)
    return;  // of a round closed, or of a device counted out
  try {
    switch (m.phase()) {
      case wire::SecAggPhase::keys: {
        auto keys = protocol::keys_of(m);
        if (keys.size() != 1 || keys[0].id != dev) throw core::error("keys must be the sender's own, one pair");
        if (!sec.agg) sec.keys[dev] = keys[0];  // after the roster: too late for this round
        break;
      }
      case wire::SecAggPhase::shares: {
        if (!sec.agg || sec.shared.count(dev)) return;
        const auto& roster = sec.agg->roster();
        if (std::none_of(roster.begin(), roster.end(), [dev](const auto& e) { return e.id == dev; })) return;
        auto blobs = protocol::blobs_of(m);
        std::set<std::uint32_t> to;
        for (const auto& b : blobs) to.insert(b.id);
        std::set<std::uint32_t> others;
        for (const auto& e : roster)
          if (e.id != dev) others.insert(e.id);
        if (to != others || blobs.size() != others.size())
          throw core::error("its shares must be one for every other device of the roster");
        for (auto& b : blobs) {
          const privacy::addressed from{dev, std::move(b.bytes)};
          post_secagg(b.id, {.phase = wire::SecAggPhase::shares,
                             .round = round_.number,
                             .device_id = b.id,
                             .blobs = std::span(&from, 1)});
        }
        sec.shared.insert(dev);
        break;
      }
      case wire::SecAggPhase::masked: {
        if (!sec.masking || sec.unmasking || sec.masked.count(dev)) return;  // late: counted as dropped
        const auto& set = sec.agg->mask_set();
        if (!std::binary_search(set.begin(), set.end(), dev)) return;
        const auto words =
            m.words() ? std::span(m.words()->data(), m.words()->size()) : std::span<const std::uint64_t>{};
        sec.agg->add_upload(dev, words);
        sec.masked.insert(dev);
        break;
      }
      case wire::SecAggPhase::reveal: {
        if (!sec.unmasking || sec.revealed.count(dev)) return;
        const auto survivors = sec.agg->survivors();
        if (!std::binary_search(survivors.begin(), survivors.end(), dev)) return;
        sec.agg->add_reveal(dev, protocol::blobs_of(m));
        sec.revealed.insert(dev);
        break;
      }
      default:
        throw core::error(std::string("a device does not send ") + wire::EnumNameSecAggPhase(m.phase()));
    }
  } catch (const core::error& e) {
    ex_.metrics().add("cleave_refusals_total", {{"reason", "secagg"}});
    device_failed(s, dev,
                  std::string("secure aggregation of round ") + std::to_string(round_.number) + ": " + e.what());
    return;
  }
  wake_.notify();
}

asio::awaitable<void> server_node::impl::secure_roster(clock::time_point deadline) {
  auto& sec = round_.secure;
  const auto all_keys = [this, &sec] {
    return std::all_of(round_.members.begin(), round_.members.end(), [&sec](auto id) { return sec.keys.count(id); });
  };
  co_await wake_.wait_until(all_keys, deadline);
  std::vector<privacy::roster_entry> roster;
  for (const auto& [id, k] : sec.keys)
    if (round_.members.count(id)) roster.push_back(k);
  if (roster.size() < 2) {
    spdlog::warn(
        "server: round {}: {} device{} advertised secure aggregation keys; the device blocks keep the global "
        "values this round (a sum of one device is that device's replica)",
        round_.number, roster.size(), roster.size() == 1 ? "" : "s");
    co_return;
  }
  const int threshold = privacy::default_threshold(static_cast<int>(roster.size()));
  sec.agg.emplace(round_.number, roster, threshold);
  for (const auto& e : roster)
    post_secagg(e.id, {.phase = wire::SecAggPhase::roster,
                       .round = round_.number,
                       .device_id = e.id,
                       .keys = roster,
                       .threshold = static_cast<std::uint32_t>(threshold)});
}

namespace {

std::string ranges_text(const std::vector<std::pair<int, int>>& r) {
  std::string s;
  for (const auto& [f, e] : r) s += (s.empty() ? "[" : " [") + std::to_string(f) + "," + std::to_string(e) + ")";
  return s;
}

}  // namespace

// Every block any of the devices of `set` holds: each device masks all of them (zero where it
// holds none), so no block's sum isolates a device the server could pick out. Sorted, merged.
std::vector<std::pair<int, int>> server_node::impl::held_ranges(const std::vector<std::uint32_t>& set) const {
  std::vector<std::pair<int, int>> ranges;
  for (auto id : set) {
    const auto& r = devices_.at(id).rs.route;
    for (int seg : r.segments_on(core::tier::device))
      if (r.begin(seg) < r.end(seg)) ranges.emplace_back(r.begin(seg), r.end(seg));
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<int, int>> merged;
  for (const auto& r : ranges)
    if (!merged.empty() && r.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  return merged;
}

asio::awaitable<std::string> server_node::impl::add_unmasked(const core::flat_layout& lay,
                                                             const std::vector<std::pair<int, int>>& ranges) {
  struct unmasked {
    std::vector<privacy::block_mean> blocks;
    std::string error;
  };
  auto work = [agg = &*round_.secure.agg, lay, ranges] {
    unmasked u;
    try {
      u.blocks = privacy::decode_sum(lay, ranges, agg->unmask());
    } catch (const core::error& e) {
      u.error = e.what();
    }
    return u;
  };
  auto result = co_await ex_.compute(std::move(work));
  if (result.error.empty())
    for (const auto& b : result.blocks) round_.avg->add(b.block, b.block + 1, b.weight, b.params, b.buffers);
  co_return result.error;
}

asio::awaitable<void> server_node::impl::secure_aggregate() {
  auto& sec = round_.secure;
  if (!sec.agg) co_return;
  const auto t0 = clock::now();
  const std::size_t threshold = static_cast<std::size_t>(sec.agg->threshold());
  const auto skip = [this](const std::string& why) {
    spdlog::warn("server: round {}: secure aggregation failed ({}); the device blocks keep the global values",
                 round_.number, why);
    ex_.metrics().add("cleave_secure_aggregation_failures_total", {});
  };
  // The mask set: devices of the roster that shared their seeds and finished training.
  std::vector<std::uint32_t> set;
  for (const auto& e : sec.agg->roster())
    if (sec.shared.count(e.id) && round_.done.count(e.id) && round_.members.count(e.id)) set.push_back(e.id);
  if (set.size() < threshold) {
    skip(std::to_string(set.size()) + " devices shared and trained, " + std::to_string(threshold) + " needed");
    co_return;
  }
  const auto merged = held_ranges(set);
  if (merged.empty()) co_return;  // the devices hold no blocks
  sec.ranges = merged;
  const auto lay = core::layout_of(model_);
  sec.agg->set_mask_set(set, privacy::replica_words(lay, merged));
  sec.masking = true;
  std::vector<std::uint32_t> bounds;
  for (const auto& [f, e] : merged)
    bounds.insert(bounds.end(), {static_cast<std::uint32_t>(f), static_cast<std::uint32_t>(e)});
  for (auto id : set)
    post_secagg(id, {.phase = wire::SecAggPhase::mask_set,
                     .round = round_.number,
                     .device_id = id,
                     .devices = set,
                     .blocks = bounds});
  const auto patience = std::chrono::milliseconds(static_cast<long>(c_.round_deadline_s * 1000));
  // Each wait ends early when every device it waits for answered or left.
  const auto masked_in = [this, &sec, &set] {
    return std::all_of(set.begin(), set.end(),
                       [&](auto id) { return sec.masked.count(id) || !round_.members.count(id); });
  };
  const auto masks_due = clock::now() + patience;
  co_await wake_.wait_until(masked_in, masks_due);
  const auto survivors = sec.agg->survivors(), dropped = sec.agg->dropped();
  if (survivors.size() < threshold) {
    skip(std::to_string(survivors.size()) + " masked uploads came, " + std::to_string(threshold) + " needed");
    co_return;
  }
  sec.unmasking = true;
  for (auto id : survivors)
    post_secagg(id, {.phase = wire::SecAggPhase::unmask,
                     .round = round_.number,
                     .device_id = id,
                     .devices = survivors,
                     .dropped = dropped});
  const auto revealed_in = [this, &sec, &survivors] {
    return std::all_of(survivors.begin(), survivors.end(),
                       [&](auto id) { return sec.revealed.count(id) || !round_.members.count(id); });
  };
  const auto reveals_due = clock::now() + patience;
  co_await wake_.wait_until(revealed_in, reveals_due);
  if (!sec.agg->can_unmask()) {
    skip(std::to_string(sec.revealed.size()) + " of " + std::to_string(survivors.size()) +
         " devices revealed their shares, " + std::to_string(threshold) + " needed");
    co_return;
  }
  sec.unmasked = true;  // nothing more is taken: the compute thread reads the shares now
  if (const std::string error = co_await add_unmasked(lay, merged); !error.empty()) {
    skip(error);
    co_return;
  }
  sec.n_aggregated = static_cast<int>(survivors.size());
  spdlog::info("server: round {}: device blocks {} aggregated securely from {} devices{} in {:.0f} ms", round_.number,
               ranges_text(merged), survivors.size(),
               dropped.empty() ? std::string() : fmt::format(" ({} dropped after masking)", dropped.size()),
               std::chrono::duration<double>(clock::now() - t0).count() * 1e3);
  ex_.metrics().add("cleave_secure_rounds_total", {});
}

void server_node::impl::check_secure_part(const runtime::session_ptr& s, const std::vector<std::uint32_t>& devs,
                                          const wire::ReplicaUpload& r) {
  const auto per_device = static_cast<std::uint64_t>(c_.local_steps) * static_cast<std::uint64_t>(c_.batch);
  std::string fault;
  if (s->role == core::tier::device) {
    if (r.first_block() != r.end_block())
      fault = "blocks [" + std::to_string(r.first_block()) + ", " + std::to_string(r.end_block()) +
              ") uploaded in the clear under secure aggregation";
    else if (r.n_samples() > per_device)
      fault =
          "claims " + std::to_string(r.n_samples()) + " samples; the round's steps allow " + std::to_string(per_device);
  } else {
    for (auto d : devs) {
      const auto& route = devices_.at(d).rs.route;
      for (int seg : route.segments_on(core::tier::device))
        if (static_cast<int>(r.first_block()) < route.end(seg) && route.begin(seg) < static_cast<int>(r.end_block()))
          fault = "device " + std::to_string(d) + "'s blocks uploaded in the clear under secure aggregation";
    }
  }
  if (fault.empty()) return;
  round_.held.erase(s);
  round_.refused = s->identity + ": " + fault;
  ex_.metrics().add("cleave_refusals_total", {{"reason", "upload"}});
  throw core::error(s->identity + ": replica of round " + std::to_string(round_.number) + " refused: " + fault);
}

}  // namespace cleave::server
