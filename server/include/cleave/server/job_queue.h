// A long-running server's jobs, kept in its state directory: one directory per job under
// STATE/jobs/ID holding the job file as submitted (job.toml), its record (job.json: state, who
// submitted it, when, how far it got), and what its run writes (checkpoints, the JSONL run log,
// the log, the exported model). Every write is atomic, so a server killed at any point finds
// each job as it last was: a running job is resumed, the queued ones follow in order. The
// records are read once, when the queue opens; this process is their only writer after.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace cleave::server {

enum class job_state : std::uint8_t { queued, running, done, failed, cancelled };
std::string_view job_state_name(job_state s);

struct job_record {
  std::uint64_t id = 0;
  std::string file;  // the job file's name as submitted
  job_state state = job_state::queued;
  std::string submitted_by;                               // the admin certificate's name
  double submitted_at = 0, started_at = 0, ended_at = 0;  // Unix seconds (0: not yet)
  std::uint64_t rounds_done = 0, rounds = 0;
  double test_accuracy = 0;
  int devices = 0;      // in its last round
  std::string message;  // how it ended (or why it failed)
};

class job_queue {
 public:
  // Opens (creating) the state directory; throws core::error naming it when it cannot be used.
  explicit job_queue(std::filesystem::path state_dir);

  // Thread-safe. Queues the job file `text` (already validated), returns its id.
  std::uint64_t submit(const std::string& text, const std::string& file, const std::string& who);
  // Every job, oldest first; one job.
  std::vector<job_record> list() const;
  std::optional<job_record> find(std::uint64_t id) const;
  // The job to run next: one left running by a server that stopped, else the oldest queued.
  std::optional<job_record> next() const;
  // Stores a job's record (its state, progress or result).
  void update(const job_record& r);
  // A queued job becomes cancelled; false when it is not queued.
  bool cancel_queued(std::uint64_t id, const std::string& who);

  std::filesystem::path dir_of(std::uint64_t id) const;
  std::string text_of(std::uint64_t id) const;
  const std::filesystem::path& state_dir() const { return dir_; }

 private:
  std::optional<job_record> read(std::uint64_t id) const;  // from its job.json
  void store(const job_record& r);                         // to its job.json and records_ (mu_ held)

  std::filesystem::path dir_;
  mutable std::mutex mu_;
  std::uint64_t last_id_ = 0;
  std::map<std::uint64_t, job_record> records_;  // every job with a record, by id
};

// The jobs as a JSON array (the dashboard's), one object per record.
std::string jobs_json(const std::vector<job_record>& jobs);

}  // namespace cleave::server
