// Splitting a data set across N clients: IID, Dirichlet(alpha) non-IID, and k classes per
// client. Deterministic for a seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cleave::core {

using shard = std::vector<std::int64_t>;  // sample indices, ascending

std::vector<shard> partition_iid(std::int64_t n_samples, int n_clients, std::uint64_t seed);
// Each class's samples split by proportions drawn from Dirichlet(alpha); every client gets at
// least one sample (resampled otherwise).
std::vector<shard> partition_dirichlet(const std::vector<std::int32_t>& labels, int n_classes, int n_clients,
                                       double alpha, std::uint64_t seed);
// Each client holds k distinct classes; each class's samples are split evenly among its holders.
std::vector<shard> partition_classes(const std::vector<std::int32_t>& labels, int n_classes, int n_clients, int k,
                                     std::uint64_t seed);

// How a data set is split across its clients: IID, Dirichlet(alpha), k classes each, or every
// sample to every client.
struct partition_spec {
  enum class kind : std::uint8_t { iid, dirichlet, classes, all } how = kind::iid;
  double alpha = 0.5;  // dirichlet
  int k = 2;           // classes
};
// "iid", "dirichlet:ALPHA", "classes:K" or "all"; throws core::error naming a bad one.
partition_spec parse_partition(const std::string& text);
// The text parse_partition reads back.
std::string partition_name(const partition_spec& p);

// Shard `index` of `n_shards` of a data set with these labels, split as `partition` says, drawn
// with `seed`. Throws core::error naming a bad partition or shard.
shard pick_shard(const partition_spec& partition, const std::vector<std::int32_t>& labels, int n_classes, int n_shards,
                 int index, std::uint64_t seed);
shard pick_shard(const std::string& partition, const std::vector<std::int32_t>& labels, int n_classes, int n_shards,
                 int index, std::uint64_t seed);

}  // namespace cleave::core
