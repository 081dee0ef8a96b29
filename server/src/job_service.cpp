// The long-running server: the queue's jobs one after another on one address, a lobby for
// operators between them, each job's log in its directory.
#include "cleave/server/job_service.h"

#include <fmt/format.h>
#include <malloc.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <optional>

#include "admin_desk.h"
#include "cleave/core/checkpoint.h"
#include "cleave/core/clock.h"
#include "cleave/core/error.h"
#include "cleave/core/model.h"
#include "cleave/core/safetensors.h"
#include "cleave/core/torch_export.h"
#include "cleave/metrics/exporter.h"
#include "cleave/runtime/executors.h"
#include "cleave/runtime/sessions.h"
#include "publisher.h"

namespace cleave::server {

namespace fs = std::filesystem;

namespace {

// Every log line of the process, also into the running job's log file while one runs.
class job_log_sink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  void open(const fs::path& p) {
    std::lock_guard lock(mutex_);
    out_.close();
    out_.clear();
    out_.open(p, std::ios::app);
  }
  void close() {
    std::lock_guard lock(mutex_);
    out_.close();
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (!out_.is_open()) return;
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    out_.write(line.data(), static_cast<std::streamsize>(line.size()));
  }
  void flush_() override {
    if (out_.is_open()) out_.flush();
  }

 private:
  std::ofstream out_;
};

// Between jobs: operators are served; edges and devices are held connected (heartbeats keep the
// channels up) and told to come back when a job starts or the server stops, so that they join
// the next job at once instead of polling.
class lobby {
 public:
  lobby(const server_config& c, const admin_handler& h, std::function<std::string()> jobs)
      : c_(c), desk_(h), jobs_(std::move(jobs)), ex_("server") {}

  void run(const std::function<void(std::uint16_t)>& on_port) {
    tls_.emplace(transport::tls_files_in(c_.certs, c_.name));
    acceptor_.emplace(ex_, *tls_, c_.listen_host, c_.port, c_.allowed, c_.links,
                      runtime::acceptor::handlers{[this](const runtime::session_ptr& s, const transport::message&) {
                                                    if (s->role == core::tier::admin) return desk_.admit(s);
                                                    spdlog::debug("server: {} waits for the next job", s->identity);
                                                  },
                                                  [this](const runtime::session_ptr& s, transport::message m) {
                                                    if (s->role == core::tier::admin)
                                                      desk_.on_message(s, m);  // the rest waits
                                                  },
                                                  [](const runtime::session_ptr&, const std::string&) {}});
    on_port(acceptor_->port());
    if (!c_.metrics.empty()) ex_.serve_metrics(c_, [] { return std::string(); });
    if (!c_.dashboard.empty()) open_dashboard();
    ex_.on_reload([this] { runtime::reload_credentials(ex_, *tls_, &*acceptor_, nullptr); });
    ex_.on_shutdown([this](std::string why) -> asio::awaitable<void> {
      for (const auto& s : acceptor_->sessions())
        if (s->role != core::tier::admin) s->post(transport::make_error(wire::ErrorCode::no_job, why));
      co_await acceptor_->shutdown();
    });
    ex_.stop_on_signals();
    ex_.run();
  }
  void stop(const std::string& why) { ex_.stop(why); }

 private:
  // The dashboard between jobs: the queue, and the edges and devices waiting for the next job.
  void open_dashboard() {
    std::vector<metrics::page> pages{{"/", "text/html; charset=utf-8", [this] { return dashboard_page(state()); }},
                                     {"/api/state", "application/json", [this] { return state(); }}};
    ex_.serve_pages(c_.dashboard, std::move(pages), metrics::http_options{"--dashboard", c_.dashboard_token});
  }
  std::string state() {
    auto made = std::make_shared<std::string>();
    if (ex_.run_on_io([this, made] { *made = board().dump(); }, std::chrono::seconds(1))) return *made;
    return board_without_sessions().dump();  // a stopping node
  }
  // What there is between jobs; the page fills in the rest of a job's state.
  nlohmann::json board_without_sessions() const {
    const double now = core::unix_now();
    return {{"server", c_.name},
            {"phase", "between jobs"},
            {"started_at", now},
            {"now", now},
            {"edges", nlohmann::json::array()},
            {"devices", nlohmann::json::array()},
            {"devices_connected", 0},
            {"jobs", nlohmann::json::parse(jobs_())}};
  }
  nlohmann::json board() const {  // on the I/O thread
    auto out = board_without_sessions();
    for (const auto& s : acceptor_->sessions()) {
      if (s->role == core::tier::edge) out["edges"].push_back({{"name", s->identity}, {"connected", true}});
      if (s->role != core::tier::device) continue;
      out["devices"].push_back(
          {{"id", s->id}, {"name", s->identity}, {"connected", true}, {"via", c_.name}, {"state", "waiting"}});
    }
    out["devices_connected"] = out["devices"].size();
    return out;
  }

  const server_config& c_;
  admin_desk desk_;
  std::function<std::string()> jobs_;
  runtime::executors ex_;
  std::optional<transport::tls_context> tls_;
  std::optional<runtime::acceptor> acceptor_;
};

std::string describe(const job_record& r) {
  std::string s = fmt::format("job {} ({}): {}", r.id, r.file, job_state_name(r.state));
  if (r.rounds) s += fmt::format(", round {} of {}", r.rounds_done, r.rounds);
  if (r.rounds_done) s += fmt::format(", test accuracy {:.4f}, {} devices", r.test_accuracy, r.devices);
  if (!r.message.empty()) s += "; " + r.message;
  return s;
}

// Bytes [offset, offset + max) of a file, and whether they reach its end.
std::pair<std::vector<std::uint8_t>, bool> piece_of(const fs::path& p, std::uint64_t offset, std::size_t max) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return {{}, true};
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(in.tellg());
  if (offset >= size) return {{}, true};
  const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(max, size - offset));
  std::vector<std::uint8_t> out(n);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n));
  return {std::move(out), offset + n >= size};
}

bool ended(job_state s) {
  return s == job_state::done || s == job_state::failed || s == job_state::cancelled;
}

}  // namespace

class job_service::impl {
 public:
  explicit impl(job_service_config c) : c_(std::move(c)), queue_(c_.state_dir), port_(c_.node.port) {
    if (!c_.settings_for) throw core::error("a job service needs a job file reader");
    handler_ = [this](const protocol::admin_request& r, const std::string& who) { return handle(r, who); };
    sink_->set_pattern("%Y-%m-%d %H:%M:%S.%e %-5l %v");
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~impl() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }

  void run();
  void stop() {
    std::lock_guard lock(mu_);
    stopping_ = true;
    if (stop_current_) stop_current_("the server is stopping");
  }
  std::uint16_t port() const { return port_.load(); }

 private:
  protocol::admin_reply handle(const protocol::admin_request& r, const std::string& who);
  protocol::admin_reply submit(const protocol::admin_request& r, const std::string& who);
  protocol::admin_reply cancel(std::uint64_t id, const std::string& who);
  job_record record(std::uint64_t id) const;
  void run_lobby();
  void run_job(job_record rec);
  void finish_job(job_record& rec, const std::string& checkpoint_failure, const std::string& failure);
  // Registers what stops the node running now; false when the service is stopping.
  bool attach(std::function<void(const std::string&)> stop);

  job_service_config c_;
  job_queue queue_;
  std::atomic<std::uint16_t> port_;
  admin_handler handler_;
  std::shared_ptr<job_log_sink> sink_ = std::make_shared<job_log_sink>();
  mutable std::mutex mu_;
  bool stopping_ = false;
  std::function<void(const std::string&)> stop_current_;
  std::uint64_t running_ = 0;  // the job running (0: none)
  std::string cancelled_by_;   // of the job running
};

bool job_service::impl::attach(std::function<void(const std::string&)> stop) {
  std::lock_guard lock(mu_);
  stop_current_ = std::move(stop);
  return !stopping_;
}

void job_service::impl::run() {
  spdlog::info("server: running jobs from {}", queue_.state_dir().string());
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) break;
    }
    if (auto next = queue_.next())
      run_job(std::move(*next));
    else
      run_lobby();
  }
  attach(nullptr);
}

void job_service::impl::run_lobby() {
  auto node = c_.node;
  node.port = port_.load();
  lobby l(node, handler_, [this] { return jobs_json(queue_.list()); });
  if (!attach([&l](const std::string& why) { l.stop(why); })) return;
  if (queue_.next()) return;  // submitted in between
  l.run([this](std::uint16_t p) {
    port_.store(p);
    spdlog::info("server: no job queued; waiting for one on {}:{} (cleave job submit)", c_.node.listen_host, p);
  });
  attach(nullptr);
}

void job_service::impl::run_job(job_record rec) {
  server_config cfg;
  try {
    cfg = c_.settings_for(queue_.text_of(rec.id), rec.file);
  } catch (const std::exception& e) {
    rec.state = job_state::failed;
    rec.ended_at = core::unix_now();
    rec.message = e.what();
    queue_.update(rec);
    spdlog::error("server: job {} failed: {}", rec.id, e.what());
    return;
  }
  const fs::path dir = queue_.dir_of(rec.id);
  cfg.port = port_.load();
  cfg.checkpoint = dir / "model.ckpt";
  cfg.run_log = dir / "run.jsonl";
  cfg.fresh = cfg.force = false;  // a job left running resumes from its checkpoint
  cfg.on_admin = handler_;
  cfg.jobs_state = [this] { return jobs_json(queue_.list()); };
  cfg.on_listening = [this](std::uint16_t p) { port_.store(p); };
  cfg.on_round = [this, &rec](const round_report& r) {
    rec.rounds_done = r.round;
    rec.test_accuracy = r.test_accuracy;
    rec.devices = r.n_devices;
    queue_.update(rec);
  };
  const bool resumed = rec.state == job_state::running;
  rec.state = job_state::running;
  rec.rounds = static_cast<std::uint64_t>(cfg.rounds);
  if (!resumed) rec.started_at = core::unix_now();
  queue_.update(rec);
  sink_->open(dir / "log");
  spdlog::info("server: job {} ({}, submitted by {}) {}", rec.id, rec.file, rec.submitted_by,
               resumed ? "resumes where it stopped" : "starts");
  std::string failure;
  {
    std::optional<server_node> node;
    {
      std::lock_guard lock(mu_);
      running_ = rec.id;
      cancelled_by_.clear();
    }
    try {  // a job that cannot run fails on its own: the server goes on with the next one
      node.emplace(cfg);
      node->stop_on_signals();
      if (attach([&node](const std::string& why) { node->stop(why); })) node->run();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    attach(nullptr);
    finish_job(rec, node ? node->checkpoint_failure() : std::string(), failure);
  }
  sink_->close();
  ::malloc_trim(0);  // the job's model and data go back to the system between jobs
  if (c_.on_job_end) c_.on_job_end(rec);
}

void job_service::impl::finish_job(job_record& rec, const std::string& checkpoint_failure, const std::string& failure) {
  std::string by;
  bool stopping = false;
  {
    std::lock_guard lock(mu_);
    running_ = 0;
    by = cancelled_by_;
    stopping = stopping_;
  }
  rec.ended_at = core::unix_now();
  if (!failure.empty()) {
    rec.state = job_state::failed;
    rec.message = failure;
  } else if (!by.empty()) {
    rec.state = job_state::cancelled;
    rec.message = fmt::format("cancelled by {} after round {}", by, rec.rounds_done);
  } else if (stopping) {
    rec.ended_at = 0;  // still running: the next start resumes it
    rec.message = fmt::format("the server stopped after round {}; it resumes when the server starts", rec.rounds_done);
  } else {
    rec.state = job_state::done;
    rec.message = fmt::format("{} rounds, test accuracy {:.4f}", rec.rounds_done, rec.test_accuracy);
  }
  if (!checkpoint_failure.empty()) rec.message += "; a checkpoint write failed: " + checkpoint_failure;
  const fs::path dir = queue_.dir_of(rec.id);
  if (rec.state != job_state::running && fs::exists(dir / "model.ckpt")) {
    try {  // the model as PyTorch names it, for `cleave job download`
      const auto ck = core::load_checkpoint(dir / "model.ckpt");
      const auto model = core::parse_model_spec(ck.model_json, (dir / "model.ckpt").string());
      const auto state = core::torch_state_dict(ck, model, (dir / "model.ckpt").string());
      core::save_safetensors(dir / "model.safetensors", state.tensors, state.metadata);
    } catch (const std::exception& e) {
      rec.message += std::string("; the model was not exported: ") + e.what();
    }
  }
  queue_.update(rec);
  spdlog::log(rec.state == job_state::failed ? spdlog::level::err : spdlog::level::info, "server: {}", describe(rec));
}

job_record job_service::impl::record(std::uint64_t id) const {
  auto r = queue_.find(id);
  if (!r) throw core::error("no job " + std::to_string(id));
  return *r;
}

protocol::admin_reply job_service::impl::handle(const protocol::admin_request& r, const std::string& who) {
  if (r.action != "logs" && r.action != "download" && r.action != "list" && r.action != "status")
    spdlog::info("server: admin {}: {}{}", who, r.action, r.job ? " job " + std::to_string(r.job) : std::string());
  protocol::admin_reply out;
  out.ok = true;
  out.job = r.job;
  if (r.action == "submit") return submit(r, who);
  if (r.action == "cancel") return cancel(r.job, who);
  if (r.action == "list") {
    for (const auto& j : queue_.list()) out.text += describe(j) + "\n";
    if (out.text.empty()) out.text = "no jobs\n";
    return out;
  }
  const auto rec = record(r.job);
  if (r.action == "status") {
    out.text = describe(rec) + "\n";
    return out;
  }
  if (r.action == "logs") {
    auto [bytes, end] = piece_of(queue_.dir_of(r.job) / "log", r.offset, 256u << 10);
    out.data = std::move(bytes);
    out.offset = r.offset;
    out.done = end && ended(rec.state);  // following it: more comes while it runs
    out.text = std::string(job_state_name(rec.state));
    return out;
  }
  if (r.action == "download") {
    const fs::path p = queue_.dir_of(r.job) / "model.safetensors";
    if (!fs::exists(p))
      throw core::error("job " + std::to_string(r.job) + " has no exported model (it is " +
                        std::string(job_state_name(rec.state)) + ")");
    auto [bytes, end] = piece_of(p, r.offset, 1u << 20);
    out.data = std::move(bytes);
    out.offset = r.offset;
    out.done = end;
    return out;
  }
  throw core::error("unknown action '" + core::printable(r.action) +
                    "' (submit, list, status, logs, cancel, download)");
}

protocol::admin_reply job_service::impl::submit(const protocol::admin_request& r, const std::string& who) {
  const std::string text(r.data.begin(), r.data.end());
  std::string file = fs::path(r.text).filename().string();
  if (file.empty()) file = "job.toml";
  c_.settings_for(text, file);  // refused here, with the file, line and key, before it is queued
  const std::uint64_t id = queue_.submit(text, core::printable(file), who);
  spdlog::info("server: job {} ({}) queued by {}", id, file, who);
  {
    std::lock_guard lock(mu_);
    if (!running_ && stop_current_) stop_current_("job " + std::to_string(id) + " submitted");
  }
  protocol::admin_reply out;
  out.ok = true;
  out.job = id;
  out.text = "job " + std::to_string(id) + " queued";
  return out;
}

protocol::admin_reply job_service::impl::cancel(std::uint64_t id, const std::string& who) {
  protocol::admin_reply out;
  out.ok = true;
  out.job = id;
  if (queue_.cancel_queued(id, who)) {
    out.text = "job " + std::to_string(id) + " cancelled before it started";
    return out;
  }
  std::lock_guard lock(mu_);
  if (running_ != id) throw core::error(describe(record(id)) + ": not queued or running");
  cancelled_by_ = who;
  if (stop_current_) stop_current_("job " + std::to_string(id) + " cancelled by " + who);
  out.text = "job " + std::to_string(id) + " is stopping; its checkpoint of the last round is kept";
  return out;
}

job_service::job_service(job_service_config c) : impl_(std::make_unique<impl>(std::move(c))) {}
job_service::~job_service() = default;
void job_service::run() {
  impl_->run();
}
void job_service::stop() {
  impl_->stop();
}
std::uint16_t job_service::port() const {
  return impl_->port();
}

}  // namespace cleave::server
