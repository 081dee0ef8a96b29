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

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cleave/core/optimizer.h"
#include "cleave/split/aggregator.h"
#include "cleave/split/plan.h"

namespace cleave::server {

namespace fs = std::filesystem;

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

std::vector<fs::path> checkpoint_store::files() const {
  const std::string p = c_.checkpoint.string();
  std::vector<fs::path> out{p, p + ".next"};
  for (int k = 1; k <= c_.keep_checkpoints; ++k) out.emplace_back(p + "." + std::to_string(k));
  return out;
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
  // The new one beside the old ones first; then the old ones move down and it takes its place.
  // A crash at any point leaves every round written so far readable.
  const auto files = this->files();
  try {
    core::save_checkpoint(files[1].string(), ck);
  } catch (const core::error& e) {
    return e.what();
  }
  std::error_code ec;
  for (int k = c_.keep_checkpoints; k >= 1; --k) {
    const fs::path& from = k == 1 ? files[0] : files[static_cast<std::size_t>(k)];
    if (fs::exists(from, ec)) fs::rename(from, files[static_cast<std::size_t>(k + 1)], ec);
    if (ec) return "cannot keep '" + from.string() + "': " + ec.message();
  }
  fs::rename(files[1], files[0], ec);
  return ec ? "cannot rename '" + files[1].string() + "' into place: " + ec.message() : std::string();
}

void checkpoint_store::check_path() const {
  const fs::path& p = c_.checkpoint;
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  const std::string where = "--checkpoint '" + p.string() + "': ";
  if (fs::is_directory(p, ec)) throw core::error(where + "is a directory");
  if (!fs::exists(dir, ec)) throw core::error(where + "directory '" + dir.string() + "' does not exist");
  if (!fs::is_directory(dir, ec)) throw core::error(where + "'" + dir.string() + "' is not a directory");
  // Writable as the checkpoint will be written: a temporary file beside it.
  const fs::path probe = p.string() + ".probe";
  if (std::FILE* f = std::fopen(probe.c_str(), "wb")) {
    std::fclose(f);
    fs::remove(probe, ec);
    return;
  }
  throw core::error(where + "cannot write in '" + dir.string() + "': " + std::strerror(errno));
}

std::optional<resumed_run> checkpoint_store::load() const {
  std::optional<core::checkpoint> newest;
  std::string from, unreadable;
  if (!c_.checkpoint.empty())
    for (const auto& f : files()) {
      std::error_code ec;
      if (!fs::exists(f, ec)) continue;
      try {
        auto ck = core::load_checkpoint(f.string());
        if (!newest || ck.epoch > newest->epoch) {
          newest = std::move(ck);
          from = f.string();
        }
      } catch (const core::error& e) {
        spdlog::warn("server: {} is not a checkpoint to resume from: {}", f.string(), e.what());
        unreadable += (unreadable.empty() ? "" : "; ") + f.string() + ": " + e.what();
      }
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
