// The server's checkpoints: written after every round with the previous ones kept, and read
// back at start so that a restarted server resumes at the next round exactly: the global
// model, every device's server-side optimizer state, the plan epoch and the run's identity,
// under a configuration that must match the one it was written with; and the adaptive
// splitter's state: every device's route with its plan epoch, and the profile book.
//
// Fields besides the trainer's (text by name, in the checkpoint's meta):
//   opt:<device>:<first>-<end>:steps   steps of that server replica's optimizer (its state tensors
//                                      are "opt:<device>:<first>-<end>:<k>")
//   route:<device>, route:<device>:epoch  its route in force ("device[0,4) server[4,12)") and plan
//   book:...                           the profile book (split::profile_book::write)
//   run_id, plan_epoch, test_accuracy, test_loss, config:<setting>
#include "checkpoint_store.h"

#include <spdlog/spdlog.h>

#include <cstdio>

#include "cleave/core/optimizer.h"
#include "cleave/split/aggregator.h"
#include "cleave/split/plan.h"

namespace cleave::server {

namespace {

std::string opt_name(std::uint32_t device, int first, int end) {
  return "opt:" + std::to_string(device) + ":" + std::to_string(first) + "-" + std::to_string(end);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> checkpoint_store::fingerprint() const {
  std::vector<std::pair<std::string, std::string>> f{{"mode", std::string(mode_name(c_.mode))},
                                                     {"u_shape", c_.u_shape ? "true" : "false"},
                                                     {"cuts", split::cuts_text(c_.cuts)},
                                                     {"edge_cuts", split::cuts_text(c_.edge_cuts)},
                                                     {"local_steps", std::to_string(c_.local_steps)},
                                                     {"batch", std::to_string(c_.batch)},
                                                     {"micro_batches", std::to_string(c_.micro_batches)},
                                                     {"seed", std::to_string(c_.seed)},
                                                     {"optimizer", core::to_json(c_.opt)},
                                                     {"aggregate", split::aggregate_name(c_.aggregate)}};
  // Compression changes the math (f32 alone, the default, keeps older checkpoints readable).
  if (c_.codecs.str() != "f32") f.emplace_back("codecs", c_.codecs.str());
  // The learning rate by round depends on the run's length only under a schedule.
  if (c_.lr_schedule != core::schedule_kind::constant || c_.warmup_rounds > 0)
    f.insert(f.end(), {{"rounds", std::to_string(c_.rounds)},
                       {"lr_schedule", std::to_string(static_cast<int>(c_.lr_schedule))},
                       {"warmup_rounds", std::to_string(c_.warmup_rounds)}});
  return f;
}

core::checkpoint_series checkpoint_store::series() const {
  return {c_.checkpoint.string(), c_.keep_checkpoints};
}

std::string checkpoint_store::save(core::checkpoint ck, std::uint64_t round, const optimizer_states& opt,
                                   const std::map<std::string, std::string>& meta) const {
  // The trainer's format: named parameters and state, so that `cleave eval` and `cleave train
  // --resume` read it. The global model carries no optimizer state of its own; each device's
  // server replicas carry theirs (the devices and edges keep their own).
  std::erase_if(ck.tensors, [](const core::checkpoint::entry& e) { return e.name.rfind("o", 0) == 0; });
  ck.optimizer = "none";
  ck.step = static_cast<std::int64_t>(round) * c_.local_steps;  // the steps each replica took
  for (const auto& [id, states] : opt)
    for (const auto& s : states) {
      const std::string name = opt_name(id, s.first, s.end);
      ck.meta[name + ":steps"] = std::to_string(s.steps);
      for (std::size_t k = 0; k < s.tensors.size(); ++k)
        ck.tensors.push_back({name + ":" + std::to_string(k),
                              core::shape{static_cast<std::int64_t>(s.tensors[k].size())}, s.tensors[k]});
    }
  for (const auto& [k, v] : fingerprint()) ck.meta["config:" + k] = v;
  ck.meta.insert(meta.begin(), meta.end());
  return series().save(ck);
}

void checkpoint_store::check_path() const {
  series().check_writable("--checkpoint");
}

std::optional<resumed_run> checkpoint_store::load() const {
  if (c_.checkpoint.empty()) return std::nullopt;
  auto [newest, from, bad] = series().newest();
  std::string unreadable;
  for (const auto& [f, why] : bad) {
    spdlog::warn("server: {} is not a checkpoint to resume from: {}", f, why);
    unreadable += (unreadable.empty() ? "" : "; ") + f + ": " + why;
  }
  // Checkpoints there, none readable: starting over would rotate them away unasked.
  if (!newest && !unreadable.empty() && !c_.fresh)
    throw core::error("cannot resume: no checkpoint there can be read (" + unreadable +
                      "); restore one, or start over with --fresh --force");
  if (newest && c_.fresh && !c_.force)
    throw core::error("--fresh: '" + from + "' holds round " + std::to_string(newest->epoch) +
                      " of a run; add --force to start over and overwrite it, or leave out --fresh to resume");
  if (!newest || c_.fresh) return std::nullopt;
  resumed_run r{std::move(*newest), from};
  const core::checkpoint& ck = r.ck;
  const std::string where = "cannot resume from '" + from + "': ";
  if (ck.model_json != model_.json) throw core::error(where + "it holds another model than '" + model_.name + "'");
  for (const auto& [k, v] : fingerprint()) {
    const auto it = ck.meta.find("config:" + k);
    const std::string was = it == ck.meta.end() ? "(not recorded)" : it->second;
    if (was != v)
      throw core::error(where + "it was written with " + k + " " + was + ", this run has " + v +
                        " (use the same settings, or --fresh --force to start over)");
  }
  try {
    r.run_id = std::stoull(ck.meta.at("run_id"));
    r.plan_epoch = static_cast<std::uint32_t>(std::stoul(ck.meta.at("plan_epoch")));
    r.test_accuracy = std::stod(ck.meta.at("test_accuracy"));
    r.test_loss = std::stod(ck.meta.at("test_loss"));
    for (const auto& [key, steps] : ck.meta) {
      std::uint32_t dev = 0;
      int first = 0, end = 0;
      if (key.rfind("opt:", 0) != 0 || std::sscanf(key.c_str(), "opt:%u:%d-%d:steps", &dev, &first, &end) != 3)
        continue;
      runtime::segment_runner::optimizer_state s{first, end, {}, std::stoll(steps)};
      for (std::size_t k = 0; const auto* e = ck.find(opt_name(dev, first, end) + ":" + std::to_string(k)); ++k)
        s.tensors.push_back(e->values);
      r.opt[dev].push_back(std::move(s));
    }
  } catch (const std::exception& e) {  // a field missing or unreadable
    throw core::error(where + "its round state is incomplete (" + e.what() + ")");
  }
  return r;
}

}  // namespace cleave::server
