// Secure aggregation of a round's device replicas as the server drives it: keys -> roster, shares
// forwarded between devices, the mask set, masked uploads, unmasking, the sum into the aggregate.
#include "secure_round.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "cleave/privacy/masked_replica.h"
#include "round.h"

namespace cleave::server {

void secure_round::reset(std::uint64_t round) {
  round_ = round;
  keys_.clear();
  agg_.reset();
  shared_.clear();
  masked_.clear();
  revealed_.clear();
  masking_ = unmasking_ = unmasked_ = false;
  n_aggregated_ = 0;
  decoded_.clear();
}

void secure_round::post(std::uint32_t device, const protocol::secagg_desc& d) {
  host_.post(device, protocol::make_secagg(d));
}

void secure_round::on_message(std::uint32_t dev, const wire::SecAgg& m) {
  switch (m.phase()) {
    case wire::SecAggPhase::keys: {
      auto keys = protocol::keys_of(m);
      if (keys.size() != 1 || keys[0].id != dev) throw core::error("keys must be the sender's own, one pair");
      if (!agg_) keys_[dev] = keys[0];  // after the roster: too late for this round
      break;
    }
    case wire::SecAggPhase::shares: {
      if (!agg_ || shared_.count(dev)) return;
      const auto& roster = agg_->roster();
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
        post(b.id,
             {.phase = wire::SecAggPhase::shares, .round = round_, .device_id = b.id, .blobs = std::span(&from, 1)});
      }
      shared_.insert(dev);
      break;
    }
    case wire::SecAggPhase::masked: {
      if (!masking_ || unmasking_ || masked_.count(dev)) return;  // late: counted as dropped
      const auto& set = agg_->mask_set();
      if (!std::binary_search(set.begin(), set.end(), dev)) return;
      const auto words = m.words() ? std::span(m.words()->data(), m.words()->size()) : std::span<const std::uint64_t>{};
      agg_->add_upload(dev, words);
      masked_.insert(dev);
      break;
    }
    case wire::SecAggPhase::reveal: {
      if (!unmasking_ || revealed_.count(dev)) return;
      const auto survivors = agg_->survivors();
      if (!std::binary_search(survivors.begin(), survivors.end(), dev)) return;
      agg_->add_reveal(dev, protocol::blobs_of(m));
      revealed_.insert(dev);
      break;
    }
    default:
      throw core::error(std::string("a device does not send ") + wire::EnumNameSecAggPhase(m.phase()));
  }
  wake_.notify();
}

asio::awaitable<void> secure_round::roster(const std::set<std::uint32_t>& members,
                                           std::chrono::steady_clock::time_point deadline) {
  const auto all_keys = [this, &members] {
    return std::all_of(members.begin(), members.end(), [this](auto id) { return keys_.count(id) > 0; });
  };
  co_await wake_.wait_until(all_keys, deadline);
  std::vector<privacy::roster_entry> roster;
  for (const auto& [id, k] : keys_)
    if (members.count(id)) roster.push_back(k);
  if (roster.size() < 2) {
    spdlog::warn(
        "server: round {}: {} device{} advertised secure aggregation keys; the device blocks keep the global "
        "values this round (a sum of one device is that device's replica)",
        round_, roster.size(), roster.size() == 1 ? "" : "s");
    co_return;
  }
  const int threshold = privacy::default_threshold(static_cast<int>(roster.size()));
  agg_.emplace(round_, roster, threshold);
  for (const auto& e : roster)
    post(e.id, {.phase = wire::SecAggPhase::roster,
                .round = round_,
                .device_id = e.id,
                .keys = roster,
                .threshold = static_cast<std::uint32_t>(threshold)});
}

asio::awaitable<std::string> secure_round::add_unmasked(const core::flat_layout& lay,
                                                        const std::vector<std::pair<int, int>>& ranges,
                                                        split::aggregator& avg) {
  struct unmasked {
    std::vector<privacy::block_mean> blocks;
    std::string error;
  };
  auto work = [agg = &*agg_, lay, ranges] {
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
    for (const auto& b : result.blocks) avg.add(b.block, b.block + 1, b.weight, b.params, b.buffers);
  co_return result.error;
}

// Each device of `set` masks every block at least min_holders of them hold (zero where it holds
// none): no decoded sum is over fewer devices. The device replicas of a block fewer hold stay out.
std::vector<std::pair<int, int>> secure_round::mask_ranges(const std::vector<std::uint32_t>& set) const {
  const auto routes = routes_of(set);
  const auto merged = split::device_blocks(routes, min_holders_);
  const auto held = split::device_blocks(routes);
  if (held == merged) return merged;
  std::vector<std::pair<int, int>> withheld;  // held, not in merged
  int n_withheld = 0;
  for (const auto& [f, e] : held)
    for (int b = f; b < e; ++b) {
      if (std::any_of(merged.begin(), merged.end(), [b](const auto& r) { return r.first <= b && b < r.second; }))
        continue;
      ++n_withheld;
      if (!withheld.empty() && withheld.back().second == b)
        ++withheld.back().second;
      else
        withheld.emplace_back(b, b + 1);
    }
  spdlog::info(
      "server: round {}: device blocks {} are held on fewer than {} devices (--secagg-min-holders): their device "
      "replicas stay out of this round's aggregate",
      round_, split::ranges_text(withheld), min_holders_);
  ex_.metrics().add("cleave_secure_blocks_withheld_total", {}, n_withheld);
  return merged;
}

std::vector<split::route> secure_round::routes_of(const std::vector<std::uint32_t>& ids) const {
  std::vector<split::route> routes;
  for (auto id : ids) routes.push_back(host_.route_of(id));
  return routes;
}

void secure_round::skip(const std::string& why) const {
  spdlog::warn("server: round {}: secure aggregation failed ({}); the device blocks keep the global values", round_,
               why);
  ex_.metrics().add("cleave_secure_aggregation_failures_total", {});
}

asio::awaitable<void> secure_round::aggregate(const predicate& member, const predicate& finished,
                                              split::aggregator& avg, std::chrono::milliseconds patience) {
  if (!agg_) co_return;
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t threshold = static_cast<std::size_t>(agg_->threshold());
  // The mask set: devices of the roster that shared their seeds and finished training.
  std::vector<std::uint32_t> set;
  for (const auto& e : agg_->roster())
    if (shared_.count(e.id) && finished(e.id) && member(e.id)) set.push_back(e.id);
  if (set.size() < threshold) {
    skip(std::to_string(set.size()) + " devices shared and trained, " + std::to_string(threshold) + " needed");
    co_return;
  }
  const auto merged = mask_ranges(set);
  if (merged.empty()) co_return;  // no device block is held by enough devices
  const auto lay = core::layout_of(model_);
  agg_->set_mask_set(set, privacy::replica_words(lay, merged));
  masking_ = true;
  std::vector<std::uint32_t> bounds;
  for (const auto& [f, e] : merged)
    bounds.insert(bounds.end(), {static_cast<std::uint32_t>(f), static_cast<std::uint32_t>(e)});
  for (auto id : set)
    post(id,
         {.phase = wire::SecAggPhase::mask_set, .round = round_, .device_id = id, .devices = set, .blocks = bounds});
  // Each wait ends early when every device it waits for answered or left.
  const auto answered = [&member](const std::set<std::uint32_t>& in, const std::vector<std::uint32_t>& of) {
    return [&in, &of, &member] {
      return std::all_of(of.begin(), of.end(), [&](auto id) { return in.count(id) || !member(id); });
    };
  };
  co_await wake_.wait_until(answered(masked_, set), std::chrono::steady_clock::now() + patience);
  const auto survivors = agg_->survivors(), dropped = agg_->dropped();
  if (survivors.size() < threshold) {
    skip(std::to_string(survivors.size()) + " masked uploads came, " + std::to_string(threshold) + " needed");
    co_return;
  }
  // Devices that dropped after masking leave the sum: each block must still be over enough.
  if (split::device_blocks(routes_of(survivors), min_holders_) != merged) {
    skip("with " + std::to_string(dropped.size()) + " dropped after masking, blocks of " + split::ranges_text(merged) +
         " would be decoded over fewer than " + std::to_string(min_holders_) + " devices");
    co_return;
  }
  unmasking_ = true;
  for (auto id : survivors)
    post(id, {.phase = wire::SecAggPhase::unmask,
              .round = round_,
              .device_id = id,
              .devices = survivors,
              .dropped = dropped});
  co_await wake_.wait_until(answered(revealed_, survivors), std::chrono::steady_clock::now() + patience);
  if (!agg_->can_unmask()) {
    skip(std::to_string(revealed_.size()) + " of " + std::to_string(survivors.size()) +
         " devices revealed their shares, " + std::to_string(threshold) + " needed");
    co_return;
  }
  unmasked_ = true;  // nothing more is taken: the compute thread reads the shares now
  if (const std::string error = co_await add_unmasked(lay, merged, avg); !error.empty()) {
    skip(error);
    co_return;
  }
  n_aggregated_ = static_cast<int>(survivors.size());
  decoded_ = merged;
  spdlog::info("server: round {}: device blocks {} aggregated securely from {} devices{} in {:.0f} ms", round_,
               split::ranges_text(merged), survivors.size(),
               dropped.empty() ? std::string() : fmt::format(" ({} dropped after masking)", dropped.size()),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e3);
  ex_.metrics().add("cleave_secure_rounds_total", {});
}

}  // namespace cleave::server
