// Partitioners of sample indices across clients.
#include "cleave/core/partition.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "cleave/core/error.h"
#include "cleave/core/random.h"

namespace cleave::core {

namespace {

void shuffle(std::vector<std::int64_t>& v, rng& r) {
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[r.below(i)]);
}

void check_clients(int n_clients, std::int64_t n_samples) {
  if (n_clients < 1) throw error("number of clients must be >= 1, got " + std::to_string(n_clients));
  if (n_samples < n_clients)
    throw error("cannot split " + std::to_string(n_samples) + " samples across " + std::to_string(n_clients) +
                " clients");
}

std::vector<std::vector<std::int64_t>> by_class(const std::vector<std::int32_t>& labels, int n_classes, rng& r) {
  std::vector<std::vector<std::int64_t>> c(static_cast<std::size_t>(n_classes));
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || labels[i] >= n_classes) throw error("label " + std::to_string(labels[i]) + " out of range");
    c[static_cast<std::size_t>(labels[i])].push_back(static_cast<std::int64_t>(i));
  }
  for (auto& v : c) shuffle(v, r);
  return c;
}

void finish(std::vector<shard>& shards) {
  for (auto& s : shards) std::sort(s.begin(), s.end());
}

}  // namespace

std::vector<shard> partition_iid(std::int64_t n_samples, int n_clients, std::uint64_t seed) {
  check_clients(n_clients, n_samples);
  rng r(mix64(seed) ^ 0x11d11dULL);
  std::vector<std::int64_t> all(static_cast<std::size_t>(n_samples));
  for (std::int64_t i = 0; i < n_samples; ++i) all[static_cast<std::size_t>(i)] = i;
  shuffle(all, r);
  std::vector<shard> out(static_cast<std::size_t>(n_clients));
  for (std::size_t i = 0; i < all.size(); ++i) out[i % out.size()].push_back(all[i]);
  finish(out);
  return out;
}

std::vector<shard> partition_dirichlet(const std::vector<std::int32_t>& labels, int n_classes, int n_clients,
                                       double alpha, std::uint64_t seed) {
  check_clients(n_clients, static_cast<std::int64_t>(labels.size()));
  if (!(alpha > 0.0)) throw error("Dirichlet alpha must be > 0, got " + std::to_string(alpha));
  rng r(mix64(seed) ^ 0xd1d1ULL);
  const auto classes = by_class(labels, n_classes, r);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    std::vector<shard> out(static_cast<std::size_t>(n_clients));
    for (const auto& members : classes) {
      std::vector<double> p(static_cast<std::size_t>(n_clients));
      double sum = 0.0;
      for (auto& v : p) sum += (v = r.gamma(alpha));
      // Cumulative cut points over this class's samples.
      double acc = 0.0;
      std::size_t start = 0;
      for (std::size_t c = 0; c < p.size(); ++c) {
        acc += p[c] / sum;
        const std::size_t stop = c + 1 == p.size()
                                     ? members.size()
                                     : std::min(members.size(), static_cast<std::size_t>(acc * members.size() + 0.5));
        for (std::size_t i = start; i < stop; ++i) out[c].push_back(members[i]);
        start = std::max(start, stop);
      }
    }
    if (std::all_of(out.begin(), out.end(), [](const shard& s) { return !s.empty(); })) {
      finish(out);
      return out;
    }
  }
  throw error("Dirichlet partition with alpha " + std::to_string(alpha) + " left a client without samples " +
              "after 1000 draws: raise alpha or lower the number of clients");
}

std::vector<shard> partition_classes(const std::vector<std::int32_t>& labels, int n_classes, int n_clients, int k,
                                     std::uint64_t seed) {
  check_clients(n_clients, static_cast<std::int64_t>(labels.size()));
  if (k < 1 || k > n_classes)
    throw error("classes per client must be in [1, " + std::to_string(n_classes) + "], got " + std::to_string(k));
  rng r(mix64(seed) ^ 0xc1a55ULL);
  const auto classes = by_class(labels, n_classes, r);
  std::vector<std::int64_t> order(static_cast<std::size_t>(n_classes));
  for (int c = 0; c < n_classes; ++c) order[static_cast<std::size_t>(c)] = c;
  shuffle(order, r);
  // Client i holds classes order[(i*k + j) mod C]: consecutive clients cover all classes.
  std::vector<std::vector<int>> holders(static_cast<std::size_t>(n_classes));
  for (int i = 0; i < n_clients; ++i)
    for (int j = 0; j < k; ++j)
      holders[static_cast<std::size_t>(order[static_cast<std::size_t>((i * k + j) % n_classes)])].push_back(i);
  std::vector<shard> out(static_cast<std::size_t>(n_clients));
  for (int c = 0; c < n_classes; ++c) {
    const auto& h = holders[static_cast<std::size_t>(c)];
    const auto& members = classes[static_cast<std::size_t>(c)];
    for (std::size_t i = 0; i < members.size() && !h.empty(); ++i)
      out[static_cast<std::size_t>(h[i % h.size()])].push_back(members[i]);
  }
  for (std::size_t i = 0; i < out.size(); ++i)
    if (out[i].empty())
      throw error("client " + std::to_string(i) + " got no samples with " + std::to_string(k) + " classes per client");
  finish(out);
  return out;
}

partition_spec parse_partition(const std::string& p) {
  auto number = [&](std::size_t at, const char* form) {
    try {
      std::size_t used = 0;
      const double v = std::stod(p.substr(at), &used);
      if (at + used == p.size()) return v;
    } catch (...) {
    }
    throw error("partition '" + p + "': expected " + form);
  };
  partition_spec s;
  if (p == "all")
    s.how = partition_spec::kind::all;
  else if (p == "iid")
    s.how = partition_spec::kind::iid;
  else if (p.rfind("dirichlet:", 0) == 0)
    s = {partition_spec::kind::dirichlet, number(10, "dirichlet:ALPHA, e.g. dirichlet:0.5"), 2};
  else if (p.rfind("classes:", 0) == 0)
    s = {partition_spec::kind::classes, 0.5, static_cast<int>(number(8, "classes:K, e.g. classes:2"))};
  else
    throw error("partition '" + p + "': expected iid, dirichlet:ALPHA, classes:K or all");
  return s;
}

std::string partition_name(const partition_spec& p) {
  switch (p.how) {
    case partition_spec::kind::all:
      return "all";
    case partition_spec::kind::dirichlet:
      return fmt::format("dirichlet:{}", p.alpha);
    case partition_spec::kind::classes:
      return fmt::format("classes:{}", p.k);
    default:
      return "iid";
  }
}

shard pick_shard(const partition_spec& p, const std::vector<std::int32_t>& labels, int n_classes, int n_shards,
                 int index, std::uint64_t seed) {
  if (n_shards < 1 || index < 0 || index >= n_shards)
    throw error("shard " + std::to_string(index) + " of " + std::to_string(n_shards) + " does not exist");
  const auto n = static_cast<std::int64_t>(labels.size());
  if (p.how == partition_spec::kind::all) {
    shard s(labels.size());
    for (std::int64_t i = 0; i < n; ++i) s[static_cast<std::size_t>(i)] = i;
    return s;
  }
  std::vector<shard> all;
  if (p.how == partition_spec::kind::iid)
    all = partition_iid(n, n_shards, seed);
  else if (p.how == partition_spec::kind::dirichlet)
    all = partition_dirichlet(labels, n_classes, n_shards, p.alpha, seed);
  else
    all = partition_classes(labels, n_classes, n_shards, p.k, seed);
  return all[static_cast<std::size_t>(index)];
}

shard pick_shard(const std::string& partition, const std::vector<std::int32_t>& labels, int n_classes, int n_shards,
                 int index, std::uint64_t seed) {
  if (n_shards < 1 || index < 0 || index >= n_shards)
    throw error("shard " + std::to_string(index) + " of " + std::to_string(n_shards) + " does not exist");
  return pick_shard(parse_partition(partition), labels, n_classes, n_shards, index, seed);
}

}  // namespace cleave::core
