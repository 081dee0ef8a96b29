// A long-running server: a queue of jobs in a state directory, run one after another on the same
// address while edges and agents stay connected between them. Operators (certificates of the
// admin role) submit, list, follow, cancel and download jobs over the same TLS listener
// (`cleave job`). Between jobs the server holds no model: devices that connect are told no job
// runs and come back after their backoff.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "cleave/server/job_queue.h"
#include "cleave/server/server_node.h"

namespace cleave::server {

struct job_service_config {
  // The server's own settings: certificates, address, backend, metrics, memory budget. A job's
  // settings (settings_for) start from these; its checkpoint and run log go to its directory.
  server_config node;
  std::filesystem::path state_dir;
  // A job file's text -> the server's settings for that job. Throws core::error naming the file,
  // the line and the key of the first problem: a job is validated before it is queued.
  std::function<server_config(const std::string& text, const std::string& file)> settings_for;
  // After each job ends (tests, scripts).
  std::function<void(const job_record&)> on_job_end;
};

class job_service {
 public:
  explicit job_service(job_service_config c);
  ~job_service();
  job_service(const job_service&) = delete;
  job_service& operator=(const job_service&) = delete;

  // Runs jobs as they come until stop(); a job that fails is recorded as failed and the next
  // one runs. Throws core::error when the state directory or the address cannot be used.
  void run();
  void stop();  // thread-safe: the job running stops (its checkpoint kept) and run() returns
  // The address it listens on (once run() has bound it; the configured port before).
  std::uint16_t port() const;

 private:
  class impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace cleave::server
