// The device's own policy: what it trains whatever the server plans (`--allow-model`,
// `--min-device-blocks`, a trained layer below its first cut, finite global weights).
#pragma once

#include <span>

#include "cleave/core/optimizer.h"
#include "cleave/device/agent.h"
#include "cleave/split/plan.h"

namespace cleave::device {

// What a plan asks of this device besides its route: how it trains, micro-batches of how many.
struct plan_terms {
  core::optimizer_config opt;
  std::uint32_t micro_batch = 1;
  std::uint64_t memory_budget = 0;  // this device's (0: unlimited)
  std::string dataset;              // the data set the plan trains on ("": any)
};

// Throws core::error naming the rule route r of model m (its spec as the plan carried it) breaks;
// nothing of the plan is allocated before.
void check_plan_policy(const agent_config& c, const core::model_spec& m, const split::route& r, const plan_terms& t);
// The data set a device holds by name ("" when `c` names none), and the offer ("NAME=DIR") of
// data set `name` among c.offers ("" when it offers none such). Throws core::error naming a
// malformed offer.
std::string held_data_set(const agent_config& c);
std::string offer_of(const agent_config& c, const std::string& name);
// Throws core::error when global weights of `round` hold a value that is not finite.
void check_global_weights(std::uint64_t round, std::span<const float> params, std::span<const float> buffers);

}  // namespace cleave::device
