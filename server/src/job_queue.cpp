// The state directory of a long-running server: one directory per job, its record as JSON.
#include "cleave/server/job_queue.h"

#include <nlohmann/json.hpp>

#include "cleave/core/atomic_file.h"
#include "cleave/core/clock.h"
#include "cleave/core/error.h"

namespace cleave::server {

namespace fs = std::filesystem;

namespace {

constexpr job_state all_states[] = {job_state::queued, job_state::running, job_state::done, job_state::failed,
                                    job_state::cancelled};

nlohmann::json to_json(const job_record& r) {
  return {{"id", r.id},
          {"file", r.file},
          {"state", job_state_name(r.state)},
          {"submitted_by", r.submitted_by},
          {"submitted_at", r.submitted_at},
          {"started_at", r.started_at},
          {"ended_at", r.ended_at},
          {"rounds_done", r.rounds_done},
          {"rounds", r.rounds},
          {"test_accuracy", r.test_accuracy},
          {"devices", r.devices},
          {"message", r.message}};
}

job_record from_json(const nlohmann::json& j) {
  job_record r;
  r.id = j.at("id").get<std::uint64_t>();
  r.file = j.at("file").get<std::string>();
  const auto state = j.at("state").get<std::string>();
  bool known = false;
  for (auto s : all_states)
    if (job_state_name(s) == state) r.state = s, known = true;
  if (!known) throw core::error("unknown job state '" + state + "'");
  r.submitted_by = j.value("submitted_by", "");
  r.submitted_at = j.value("submitted_at", 0.0);
  r.started_at = j.value("started_at", 0.0);
  r.ended_at = j.value("ended_at", 0.0);
  r.rounds_done = j.value("rounds_done", std::uint64_t{0});
  r.rounds = j.value("rounds", std::uint64_t{0});
  r.test_accuracy = j.value("test_accuracy", 0.0);
  r.devices = j.value("devices", 0);
  r.message = j.value("message", "");
  return r;
}

}  // namespace

std::string jobs_json(const std::vector<job_record>& jobs) {
  auto out = nlohmann::json::array();
  for (const auto& r : jobs) out.push_back(to_json(r));
  return out.dump();
}

std::string_view job_state_name(job_state s) {
  switch (s) {
    case job_state::queued:
      return "queued";
    case job_state::running:
      return "running";
    case job_state::done:
      return "done";
    case job_state::failed:
      return "failed";
    case job_state::cancelled:
      return "cancelled";
  }
  return "?";
}

job_queue::job_queue(fs::path state_dir) : dir_(std::move(state_dir)) {
  std::error_code ec;
  fs::create_directories(dir_ / "jobs", ec);
  if (ec) throw core::error("state directory '" + dir_.string() + "': " + ec.message());
  for (const auto& e : fs::directory_iterator(dir_ / "jobs")) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::uint64_t id = std::stoull(name);
    last_id_ = std::max(last_id_, id);
    if (auto r = read(id)) records_.emplace(id, std::move(*r));
  }
}

void job_queue::store(const job_record& r) {
  core::write_file_atomically(dir_of(r.id) / "job.json", to_json(r).dump(2) + "\n", 0640);
  records_[r.id] = r;
}

fs::path job_queue::dir_of(std::uint64_t id) const {
  return dir_ / "jobs" / std::to_string(id);
}

std::string job_queue::text_of(std::uint64_t id) const {
  return core::read_file(dir_of(id) / "job.toml");
}

std::uint64_t job_queue::submit(const std::string& text, const std::string& file, const std::string& who) {
  std::lock_guard lock(mu_);
  const std::uint64_t id = ++last_id_;
  const auto d = dir_of(id);
  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec) throw core::error("job directory '" + d.string() + "': " + ec.message());
  core::write_file_atomically(d / "job.toml", text, 0640);
  job_record r;
  r.id = id;
  r.file = file;
  r.submitted_by = who;
  r.submitted_at = core::unix_now();
  store(r);  // the record last: a job without one (a crash between the two writes) is never run
  return id;
}

std::optional<job_record> job_queue::read(std::uint64_t id) const {
  const auto p = dir_of(id) / "job.json";
  if (!fs::exists(p)) return std::nullopt;
  try {
    return from_json(nlohmann::json::parse(core::read_file(p)));
  } catch (const std::exception& e) {
    throw core::error("job record '" + p.string() + "': " + e.what());
  }
}

std::vector<job_record> job_queue::list() const {
  std::lock_guard lock(mu_);
  std::vector<job_record> out;
  for (const auto& [id, r] : records_) out.push_back(r);
  return out;
}

std::optional<job_record> job_queue::find(std::uint64_t id) const {
  std::lock_guard lock(mu_);
  const auto it = records_.find(id);
  return it == records_.end() ? std::nullopt : std::optional<job_record>(it->second);
}

std::optional<job_record> job_queue::next() const {
  const auto all = list();
  for (const auto& r : all)
    if (r.state == job_state::running) return r;
  for (const auto& r : all)
    if (r.state == job_state::queued) return r;
  return std::nullopt;
}

void job_queue::update(const job_record& r) {
  std::lock_guard lock(mu_);
  store(r);
}

bool job_queue::cancel_queued(std::uint64_t id, const std::string& who) {
  std::lock_guard lock(mu_);
  const auto it = records_.find(id);
  if (it == records_.end() || it->second.state != job_state::queued) return false;
  job_record r = it->second;
  r.state = job_state::cancelled;
  r.ended_at = core::unix_now();
  r.message = "cancelled by " + who + " before it started";
  store(r);
  return true;
}

}  // namespace cleave::server
