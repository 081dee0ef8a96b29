// Secure aggregation of a round's device replicas as the server drives it (privacy/secagg.h):
// keys -> roster, shares forwarded, after training the mask set, masked uploads, the unmask
// request, the revealed shares, and the unmasked sum added to the round's aggregate.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cleave/core/model.h"
#include "cleave/privacy/secagg.h"
#include "cleave/protocol/protocol.h"
#include "cleave/runtime/executors.h"
#include "cleave/split/aggregator.h"

namespace cleave::server {

class round_host;

class secure_round {
 public:
  // Who is still counted in the round, and who finished training.
  using predicate = std::function<bool(std::uint32_t)>;
  // min_holders: the fewest devices a block's decoded sum may be over.
  secure_round(round_host& h, runtime::executors& ex, runtime::signal& wake, const core::model_spec& m, int min_holders)
      : host_(h), ex_(ex), wake_(wake), model_(m), min_holders_(min_holders) {}

  // A new round (or attempt): nothing of the last one is kept.
  void reset(std::uint64_t round);
  // A message of device `dev`, counted in the round; throws core::error when it breaks the rules.
  void on_message(std::uint32_t dev, const wire::SecAgg& m);
  bool closed() const { return unmasked_; }
  // While training: waits until every member advertised its keys (or `deadline`), then sends the
  // roster.
  asio::awaitable<void> roster(const std::set<std::uint32_t>& members, std::chrono::steady_clock::time_point deadline);
  // After training: the masked uploads of the devices that shared and finished, unmasked into avg
  // (each wait at most `patience`); the device blocks keep the global values when that fails.
  // Only blocks at least min_holders of the uploading devices held are masked and decoded; the
  // others keep their global values.
  asio::awaitable<void> aggregate(const predicate& member, const predicate& finished, split::aggregator& avg,
                                  std::chrono::milliseconds patience);
  int n_aggregated() const { return n_aggregated_; }
  const std::vector<std::pair<int, int>>& decoded() const { return decoded_; }  // blocks of the sum

 private:
  void post(std::uint32_t device, const protocol::secagg_desc& d);
  asio::awaitable<std::string> add_unmasked(const core::flat_layout& lay,
                                            const std::vector<std::pair<int, int>>& ranges, split::aggregator& avg);
  void skip(const std::string& why) const;
  std::vector<split::route> routes_of(const std::vector<std::uint32_t>& ids) const;
  std::vector<std::pair<int, int>> mask_ranges(const std::vector<std::uint32_t>& set) const;

  round_host& host_;
  runtime::executors& ex_;
  runtime::signal& wake_;
  const core::model_spec& model_;
  int min_holders_;
  std::uint64_t round_ = 0;
  std::map<std::uint32_t, privacy::roster_entry> keys_;  // advertised this round
  std::optional<privacy::secagg_server> agg_;            // once the roster is out
  std::set<std::uint32_t> shared_;                       // their shares went out to every member
  std::set<std::uint32_t> masked_, revealed_;            // uploads and reveals in
  bool masking_ = false, unmasking_ = false, unmasked_ = false;
  int n_aggregated_ = 0;  // survivors whose blocks are in the aggregate
  std::vector<std::pair<int, int>> decoded_;
};

}  // namespace cleave::server
