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
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>

#include "server_impl.h"

namespace cleave::server {

namespace fs = std::filesystem;

namespace {

std::string opt_name(std::uint32_t device, int first, int end) {
  return "opt:" + std::to_string(device) + ":" + std::to_string(first) + "-" + std::to_string(end);
}

constexpr std::string_view book_prefix = "book:";

// The field `key` of a checkpoint; throws naming it when it is not there.
const std::string& field(const core::checkpoint& ck, const std::string& key) {
  const auto it = ck.meta.find(key);
  if (it == ck.meta.end()) throw core::error(key + " is missing");
  return it->second;
}

// A whole field as a count; throws naming it.
std::uint64_t count_of(const std::string& text, const std::string& key) {
  std::uint64_t v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc{} || r.ptr != text.data() + text.size() || text.empty())
    throw core::error(key + ": '" + text + "' is not a count");
  return v;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> server_node::impl::fingerprint() const {
  std::vector<std::pair<std::string, std::string>> f{{"mode", std::string(mode_name(c_.mode))},
                                                     {"u_shape", c_.u_shape ? "true" : "false"},
                                                     {"cuts", c_.cuts},
                                                     {"edge_cuts", c_.edge_cuts},
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

std::vector<fs::path> server_node::impl::checkpoint_files() const {
  const std::string p = c_.checkpoint.string();
  std::vector<fs::path> out{p, p + ".next"};
  for (int k = 1; k <= c_.keep_checkpoints; ++k) out.emplace_back(p + "." + std::to_string(k));
  return out;
}

std::map<std::string, std::string> server_node::impl::splitter_state(
    const std::vector<std::pair<std::uint32_t, split::route>>& routes) const {
  std::map<std::string, std::string> m;
  m["plan_epoch"] = std::to_string(plan_epoch_);
  for (const auto& [id, d] : devices_) {
    const bool in_round = std::any_of(routes.begin(), routes.end(), [id = id](const auto& r) { return r.first == id; });
    if (!d.connected && !in_round) continue;
    const std::string key = "route:" + std::to_string(id);
    m[key] = d.rs.route.str();
    m[key + ":epoch"] = std::to_string(d.rs.epoch);
  }
  if (book_) book_->write(m, book_prefix);
  return m;
}

std::string server_node::impl::save_checkpoint(std::uint64_t round,
                                               const std::vector<std::pair<std::uint32_t, split::route>>& routes,
                                               const std::map<std::string, std::string>& state) {
  // The trainer's format: named parameters and state, so that `cleave eval` and `cleave train
  // --resume` read it. The global model carries no optimizer state of its own; each device's
  // server replicas carry theirs (the devices and edges keep their own).
  core::checkpoint ck = core::capture(eval_->model_stage(), eval_->opt(), c_.seed, static_cast<std::int64_t>(round));
  std::erase_if(ck.tensors, [](const core::checkpoint::entry& e) { return e.name.rfind("o", 0) == 0; });
  ck.optimizer = "none";
  ck.step = static_cast<std::int64_t>(round) * c_.local_steps;  // the steps each replica took
  for (const auto& [id, r] : routes)
    for (const auto& s : runner_->optimizer_states(id, r)) {
      const std::string name = opt_name(id, s.first, s.end);
      ck.meta[name + ":steps"] = std::to_string(s.steps);
      for (std::size_t k = 0; k < s.tensors.size(); ++k)
        ck.tensors.push_back({name + ":" + std::to_string(k),
                              core::shape{static_cast<std::int64_t>(s.tensors[k].size())}, s.tensors[k]});
    }
  for (const auto& [k, v] : fingerprint()) ck.meta["config:" + k] = v;
  ck.meta.insert(state.begin(), state.end());
  ck.meta["run_id"] = std::to_string(run_id_);
  ck.meta["test_accuracy"] = std::to_string(last_.test_accuracy);
  ck.meta["test_loss"] = std::to_string(last_.test_loss);
  // The new one beside the old ones first; then the old ones move down and it takes its place.
  // A crash at any point leaves every round written so far readable.
  const auto files = checkpoint_files();
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

void server_node::impl::check_checkpoint_path() const {
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

void server_node::impl::resume_or_start() {
  std::optional<core::checkpoint> newest;
  std::string from, unreadable;
  if (!c_.checkpoint.empty())
    for (const auto& f : checkpoint_files()) {
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
  if (!newest || c_.fresh) {
    std::random_device rd;
    run_id_ = (std::uint64_t{rd()} << 32 | rd()) | 1;  // never 0 ("no run")
    return;
  }
  const core::checkpoint& ck = *newest;
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
    core::restore(eval_->model_stage(), eval_->opt(), ck);
    run_id_ = std::stoull(ck.meta.at("run_id"));
    plan_epoch_ = static_cast<std::uint32_t>(std::stoul(ck.meta.at("plan_epoch")));
    last_.test_accuracy = std::stod(ck.meta.at("test_accuracy"));
    last_.test_loss = std::stod(ck.meta.at("test_loss"));
    for (const auto& [key, steps] : ck.meta) {
      std::uint32_t dev = 0;
      int first = 0, end = 0;
      if (key.rfind("opt:", 0) != 0 || std::sscanf(key.c_str(), "opt:%u:%d-%d:steps", &dev, &first, &end) != 3)
        continue;
      runtime::segment_runner::optimizer_state s{first, end, {}, std::stoll(steps)};
      for (std::size_t k = 0; const auto* e = ck.find(opt_name(dev, first, end) + ":" + std::to_string(k)); ++k)
        s.tensors.push_back(e->values);
      resumed_opt_[dev].push_back(std::move(s));
    }
    resume_splitter(ck);
  } catch (const std::exception& e) {  // a field missing or unreadable
    throw core::error(where + "its round state is incomplete (" + e.what() + ")");
  }
  const core::stage& st = eval_->model_stage();
  global_p_.resize(static_cast<std::size_t>(st.n_params()));
  global_b_.resize(static_cast<std::size_t>(st.n_buffers()));
  if (!global_p_.empty()) be_->download(st.params(), global_p_.data());
  if (!global_b_.empty()) be_->download(st.buffers(), global_b_.data());
  first_round_ = static_cast<std::uint64_t>(ck.epoch) + 1;
  last_.round = static_cast<std::uint64_t>(ck.epoch);
  last_.evaluated = true;
  std::string splitter;
  if (book_) {
    std::string routes;
    for (const auto& [id, r] : resumed_routes_)
      routes += fmt::format("{}device {} {} (plan {})", routes.empty() ? "" : ", ", id, r.route.str(), r.epoch);
    splitter = fmt::format("; the splitter's book of {} node{} and {} link{}, routes: {}", book_->profiles().size(),
                           book_->profiles().size() == 1 ? "" : "s", book_->links().size(),
                           book_->links().size() == 1 ? "" : "s", routes.empty() ? "none" : routes);
  }
  spdlog::info("server: resuming from {} after round {} of {} (test accuracy {:.4f}, plan {}){}", from, ck.epoch,
               c_.rounds, last_.test_accuracy, plan_epoch_, splitter);
}

void server_node::impl::resume_splitter(const core::checkpoint& ck) {
  // A checkpoint of a fixed plan, or of a server that did not split adaptively, stores neither
  // routes worth restoring nor a book: the configured cuts and fresh profiles then.
  if (!book_) return;
  for (const auto& [key, text] : ck.meta) {
    if (!key.starts_with("route:") || key.ends_with(":epoch")) continue;
    const std::uint64_t dev = count_of(key.substr(6), key);
    if (dev == 0 || dev >= 1000000) throw core::error(key + ": device id " + std::to_string(dev) + " out of range");
    resumed_route rr;
    try {
      rr.route = split::parse_route(text, model_.n_blocks());
    } catch (const core::error& e) {
      throw core::error(key + ": " + e.what());
    }
    if (rr.route.u_shape() != c_.u_shape)
      throw core::error(key + ": " + rr.route.str() + " is " + (c_.u_shape ? "not " : "") + "U-shaped, this run " +
                        (c_.u_shape ? "is" : "is not"));
    const std::string ek = key + ":epoch";
    const std::uint64_t epoch = count_of(field(ck, ek), ek);
    if (epoch < 1 || epoch > plan_epoch_)
      throw core::error(ek + ": plan " + std::to_string(epoch) + " is not between 1 and the checkpoint's plan " +
                        std::to_string(plan_epoch_));
    rr.epoch = static_cast<std::uint32_t>(epoch);
    resumed_routes_[static_cast<std::uint32_t>(dev)] = std::move(rr);
  }
  const auto first = ck.meta.lower_bound(std::string(book_prefix));
  if (first != ck.meta.end() && first->first.starts_with(book_prefix)) book_->read(ck.meta, book_prefix);
}

}  // namespace cleave::server
