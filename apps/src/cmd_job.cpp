// `cleave job`: an operator's commands to a long-running server (`cleave server --state DIR`):
// submit, list, status, logs, cancel, download. Each is one request over a mutually
// authenticated TLS channel opened with a certificate of the admin role.
#include <spdlog/spdlog.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "cleave/core/atomic_file.h"
#include "cleave/core/error.h"
#include "cleave/protocol/protocol.h"
#include "cleave/transport/connect.h"
#include "cleave/transport/tls_context.h"
#include "commands.h"
#include "node_options.h"

namespace cleave::apps {

namespace {

// The server was not reached, or closed the channel before taking the request (it may be
// between one job and the next for a moment): the request can be sent again.
struct unreachable : core::error {
  using core::error::error;
};

struct job_args {
  std::string certs = "certs", name = "admin", server = "127.0.0.1:7000", server_name = "server";
  std::string file, out;
  std::uint64_t id = 0;
  bool follow = false;
};

// One request answered over a channel of its own.
asio::awaitable<protocol::admin_reply> exchange(transport::tls_context tls, std::string host, std::uint16_t port,
                                                job_args a, protocol::admin_request req) {
  transport::connect_options opts;
  if (!a.server_name.empty()) opts.server_identity = a.server_name;
  auto ch = co_await transport::connect(tls, host, port, opts);
  if (!ch) throw unreachable("cannot reach the server at " + a.server + ": " + ch.error().reason());
  protocol::hello_info h;
  h.role = core::tier::admin;
  h.name = a.name;
  co_await ch->send(protocol::make_hello(h));
  auto first = co_await ch->receive();
  if (!first) throw unreachable("the server at " + a.server + " closed the channel: " + first.error().reason());
  if (const auto* e = first->as<wire::Error>(); e && e->code() == wire::ErrorCode::shutting_down)
    throw unreachable("the server at " + a.server + " is between jobs");  // its next listener comes
  if (const auto* e = first->as<wire::Error>())
    throw core::error("the server refused '" + a.name +
                      "': " + core::printable(e->message() ? e->message()->str() : ""));
  co_await ch->send(protocol::make_admin_request(req));
  auto answer = co_await ch->receive();
  if (!answer) throw core::error("no answer from the server at " + a.server + ": " + answer.error().reason());
  const auto* r = answer->as<wire::AdminReply>();
  if (const auto* e = answer->as<wire::Error>())
    throw core::error("the server answered: " + core::printable(e->message() ? e->message()->str() : "an error"));
  if (!r) throw core::error("the server answered with " + std::string(transport::body_name(answer->type())));
  auto out = protocol::admin_reply_of(*r);
  co_await ch->close();
  co_return out;
}

protocol::admin_reply ask(const job_args& a, const protocol::admin_request& req) {
  if (spdlog::get_level() == spdlog::level::info) spdlog::set_level(spdlog::level::warn);  // channels' lines
  const auto [host, port] = host_port(a.server, "--server");
  const transport::tls_context tls(transport::tls_files_in(a.certs, a.name));
  // A long-running server closes its address for a moment between a job and the next: a few
  // attempts over about 3 s before saying it cannot be reached.
  for (int attempt = 1;; ++attempt) {
    try {
      asio::io_context io;
      auto f = asio::co_spawn(io, exchange(tls, host, port, a, req), asio::use_future);
      io.run();
      auto r = f.get();
      if (!r.ok) throw core::error(r.text);
      return r;
    } catch (const unreachable&) {
      if (attempt == 6) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }
}

void submit(const job_args& a) {
  protocol::admin_request req{"submit"};
  const std::string text = core::read_file(a.file);
  req.data.assign(text.begin(), text.end());
  req.text = std::filesystem::path(a.file).filename().string();
  const auto r = ask(a, req);
  std::cout << r.job << "\n";
  std::cerr << r.text << "\n";
}

void logs(const job_args& a) {
  protocol::admin_request req{"logs", a.id};
  for (;;) {
    const auto r = ask(a, req);
    std::fwrite(r.data.data(), 1, r.data.size(), stdout);
    std::fflush(stdout);
    req.offset += r.data.size();
    if (!a.follow || r.done) return;
    if (r.data.empty()) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

void download(const job_args& a) {
  protocol::admin_request req{"download", a.id};
  std::string bytes;
  for (;;) {
    const auto r = ask(a, req);
    bytes.append(r.data.begin(), r.data.end());
    req.offset += r.data.size();
    if (r.done || r.data.empty()) break;
  }
  const std::string out = a.out.empty() ? "job-" + std::to_string(a.id) + ".safetensors" : a.out;
  core::write_file_atomically(out, bytes, 0644);
  std::cerr << "job " << a.id << ": model written to " << out << " (" << bytes.size() << " bytes)\n";
}

void simple(const job_args& a, const char* action) {
  const auto r = ask(a, protocol::admin_request{action, a.id});
  std::cout << r.text;
  if (!r.text.empty() && r.text.back() != '\n') std::cout << "\n";
}

}  // namespace

void register_job_command(CLI::App& app) {
  static auto a = std::make_shared<job_args>();
  auto* job = app.add_subcommand("job", "an operator's commands to a long-running server (cleave server --state)");
  job->require_subcommand(1);
  job->add_option("--certs", a->certs, "certificate directory holding NAME.crt of the admin role")
      ->capture_default_str();
  job->add_option("--name", a->name, "this operator's certificate name (issued with --role admin)")
      ->capture_default_str();
  job->add_option("--server", a->server, "HOST:PORT of the server")->capture_default_str();
  job->add_option("--server-name", a->server_name, "the server's certificate name (\"\": any the CA signed)")
      ->capture_default_str();
  auto* s = job->add_subcommand("submit", "queue a job file; prints its id");
  s->add_option("file", a->file, "the job file (TOML: model, rounds, dataset, ...)")->required();
  s->callback([] { submit(*a); });
  job->add_subcommand("list", "every job and its state")->callback([] { simple(*a, "list"); });
  auto with_id = [](CLI::App* c) { c->add_option("id", a->id, "the job's id")->required(); };
  auto* st = job->add_subcommand("status", "one job's state and progress");
  with_id(st);
  st->callback([] { simple(*a, "status"); });
  auto* lg = job->add_subcommand("logs", "a job's log");
  with_id(lg);
  lg->add_flag("-f,--follow", a->follow, "follow it until the job ends");
  lg->callback([] { logs(*a); });
  auto* c = job->add_subcommand("cancel", "stop a queued or running job (a running one keeps its checkpoint)");
  with_id(c);
  c->callback([] { simple(*a, "cancel"); });
  auto* d = job->add_subcommand("download", "a finished or cancelled job's model (safetensors)");
  with_id(d);
  d->add_option("-o,--out", a->out, "where to write it (default job-ID.safetensors)");
  d->callback([] { download(*a); });
}

}  // namespace cleave::apps
