#include "policy.h"

#include <algorithm>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "cleave/privacy/digest.h"
#include "cleave/split/profiler.h"
#include "cleave/split/replan.h"
#include "cleave/split/replica_checks.h"

namespace cleave::device {

std::string held_data_set(const agent_config& c) {
  return c.data_name.empty() ? c.data : c.data_name;
}

std::string offer_of(const agent_config& c, const std::string& name) {
  for (const auto& o : c.offers) {
    const auto eq = o.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == o.size())
      throw core::error("--offer '" + o + "': expected NAME=DIR");
    if (o.substr(0, eq) == name) return o;
  }
  return {};
}

void check_plan_policy(const agent_config& c, const core::model_spec& m, const split::route& r, const plan_terms& t) {
  const std::string held = held_data_set(c);
  if (!t.dataset.empty() && t.dataset != held)
    throw core::error("the plan trains on data set '" + t.dataset + "'; this device holds '" + held +
                      "' (--data-name) and offers " + (c.offers.empty() ? "no other (--offer)" : "only " + [&c] {
                        std::string names;
                        for (const auto& o : c.offers)
                          names += (names.empty() ? "'" : ", '") + o.substr(0, o.find('=')) + "'";
                        return names;
                      }()));
  if (!c.allowed_models.empty()) {
    const std::string hash = privacy::sha256_hex(m.json);
    if (std::find(c.allowed_models.begin(), c.allowed_models.end(), hash) == c.allowed_models.end())
      throw core::error("model '" + m.name + "' (sha256 " + hash + ") is not one this device allows (--allow-model)");
  }
  const int bottom = r.end(0);
  if (bottom < c.min_device_blocks)
    throw core::error("route " + r.str() + " keeps " + std::to_string(bottom) +
                      " blocks on this device, fewer than its --min-device-blocks " +
                      std::to_string(c.min_device_blocks));
  // What leaves the first cut must have passed a layer that trains: otherwise it is the input,
  // reshaped or pooled.
  if (const int trained = split::trained_bottom(m); bottom < m.n_blocks() && (trained == 0 || trained > bottom))
    throw core::error("route " + r.str() + " sends what no trained layer of this device has transformed (blocks [0," +
                      std::to_string(bottom) + ") of model '" + m.name + "' have no parameters): refused");
  std::uint64_t need = 0;
  for (int seg : r.segments_on(core::tier::device)) {
    const std::uint64_t add =
        split::least_segment_bytes(m, r.begin(seg), r.end(seg), t.opt, static_cast<int>(std::max(1u, t.micro_batch)));
    need =
        add > std::numeric_limits<std::uint64_t>::max() - need ? std::numeric_limits<std::uint64_t>::max() : need + add;
  }
  if (t.memory_budget && need > t.memory_budget)
    throw core::error(fmt::format(
        "route {} needs at least {:.1f} MiB on this device (parameters, gradients, optimizer state and the activations "
        "of a micro-batch of {}), above its --memory-budget of {:.1f} MiB: refused",
        r.str(), static_cast<double>(need) / (1 << 20), std::max(1u, t.micro_batch),
        static_cast<double>(t.memory_budget) / (1 << 20)));
}

void check_global_weights(std::uint64_t round, std::span<const float> params, std::span<const float> buffers) {
  std::string bad = split::first_non_finite(params, "parameter");
  if (bad.empty()) bad = split::first_non_finite(buffers, "state value");
  if (!bad.empty())
    throw core::error("the global weights of round " + std::to_string(round) + " hold a non-finite value (" + bad +
                      "): refused");
}

}  // namespace cleave::device
