// A fleet that stays up: a long-running server (`cleave server --state`), an edge and agents that
// stay between jobs (`--stay`), and an operator's `cleave job` commands, all as real processes.
#include <doctest/doctest.h>
#include <httplib.h>
#include <signal.h>

#include <asio/ip/tcp.hpp>
#include <string>
#include <thread>

// (before nodes.h, whose read_file() would hide the reader's type of that name)
#include "../support/safetensors_reader.h"
//
#include "../security/nodes.h"
#include "../support/run_cleave.h"
#include "cleave/core/checkpoint.h"
#include "cleave/core/model.h"
#include "cleave/privacy/digest.h"

namespace cleave::testing {
namespace {

// A loopback port free now (bound, then closed): nodes that restart keep it.
std::uint16_t free_port() {
  asio::io_context io;
  asio::ip::tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

// A fleet: certificates (an admin's too), a job server on `port` with its state in `state`.
struct fleet {
  workspace w;
  std::uint16_t port = free_port(), edge_port = free_port();
  fs::path state;
  explicit fleet(const std::string& name, int n_devices) : w(name, n_devices) {
    transport::issue_options a;
    a.role = core::tier::admin;
    transport::issue_certificate(w.certs, "admin", a);
    state = w.dir / "state";
  }
  std::uint16_t dashboard_port = free_port();
  std::vector<std::string> server() const {
    return {"--log-level",
            "info",
            "server",
            "--certs",
            w.certs.string(),
            "--listen",
            "127.0.0.1:" + std::to_string(port),
            "--state",
            state.string(),
            "--backend",
            "reference",
            "--dashboard",
            std::to_string(dashboard_port)};
  }
  std::vector<std::string> edge() const {
    return {"--log-level",
            "info",
            "edge",
            "--certs",
            w.certs.string(),
            "--name",
            "edge-1",
            "--listen",
            "127.0.0.1:" + std::to_string(edge_port),
            "--server",
            "127.0.0.1:" + std::to_string(port),
            "--backend",
            "reference",
            "--stay"};
  }
  std::vector<std::string> agent(int id, bool behind_edge, const std::vector<std::string>& extra = {}) const {
    auto a = agent_args(w, id, behind_edge ? edge_port : port, {"--stay", "--data-name", "digits"});
    if (behind_edge) a.insert(a.end(), {"--upstream-name", "edge-1"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // `cleave job ACTION...` as the operator `name`.
  outcome job(const std::vector<std::string>& args, const std::string& name = "admin") const {
    std::vector<std::string> a = {
        "job", "--certs", w.certs.string(), "--name", name, "--server", "127.0.0.1:" + std::to_string(port)};
    a.insert(a.end(), args.begin(), args.end());
    return run_cleave(a);
  }
  // Writes a job file into the workspace; its path.
  std::string job_file(const std::string& name, const std::string& text) const {
    const fs::path p = w.dir / name;
    std::ofstream(p) << "data = \"" << w.data.string() << "\"\n" << text;
    return p.string();
  }
  std::string status(int id) const { return job({"status", std::to_string(id)}).output; }
  // Waits until `cleave job status ID` says `what` (up to `seconds`).
  bool wait_status(int id, const std::string& what, double seconds) const {
    const auto until = steady_clock::now() + std::chrono::duration<double>(seconds);
    while (steady_clock::now() < until) {
      if (status(id).find(what) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return false;
  }
};

// What a process holds: resident memory (KiB), open descriptors, threads.
struct holdings {
  long rss_kib = 0, fds = 0, threads = 0;
};
holdings holdings_of(const node& n) {
  holdings h;
  h.rss_kib = n.rss_kib();
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/" + std::to_string(n.pid()) + "/fd")) ++h.fds;
  std::ifstream f("/proc/" + std::to_string(n.pid()) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("Threads:", 0) == 0) h.threads = std::stol(line.substr(8));
  return h;
}

}  // namespace

TEST_CASE(
    "a fleet runs three jobs through cleave job with no node restarted: one done, one cancelled, one refused "
    "by an agent's policy") {
  fleet f("jobs-three", 4);
  const std::string mlp_sha = privacy::sha256_hex(core::resolve_model("mlp", core::shape{1, 28, 28}, 10).json);
  node server(f.w, "server", f.server());
  REQUIRE_MESSAGE(server.wait_for("waiting for one on", 30), server.log());
  node edge(f.w, "edge", f.edge());
  // Device 1 offers a second data set (the same files under another name).
  node a1(f.w, "agent-1", f.agent(1, false, {"--offer", "digits2=" + f.w.data.string()}));
  node a2(f.w, "agent-2", f.agent(2, false));
  node a3(f.w, "agent-3", f.agent(3, true));
  // Device 4 trains mlp only.
  node a4(f.w, "agent-4", f.agent(4, true, {"--allow-model", mlp_sha}));
  const std::vector<node*> all = {&server, &edge, &a1, &a2, &a3, &a4};

  SUBCASE("the operator's commands, each refused with its reason when wrong") {
    // Not an admin: refused at the handshake's admission, with the reason.
    const auto not_admin = f.job({"list"}, "device-1");
    CHECK(not_admin.status == 1);
    CHECK_MESSAGE(not_admin.output.find("refused") != std::string::npos, not_admin.output);
    // A malformed job file: refused at submit with the file, the line and the key.
    const auto bad = f.job({"submit", f.job_file("bad.toml", "rounds = 2\nroundz = 3\n")});
    CHECK(bad.status == 1);
    CHECK_MESSAGE(bad.output.find("job file 'bad.toml': line 3: unknown key 'roundz'") != std::string::npos,
                  bad.output);
    // The same reader for a one-run server's --job.
    const auto one_run =
        run_cleave({"server", "--certs", f.w.certs.string(), "--job", (f.w.dir / "bad.toml").string()});
    CHECK(one_run.status == 1);
    CHECK_MESSAGE(one_run.output.find("bad.toml': line 3: unknown key 'roundz'") != std::string::npos, one_run.output);
    const auto range = f.job({"submit", f.job_file("range.toml", "model = \"mlp\"\nrounds = 0\n")});
    CHECK_MESSAGE(range.output.find("job file 'range.toml': line 3: --rounds") != std::string::npos, range.output);
    const auto own = f.job({"submit", f.job_file("own.toml", "certs = \"x\"\n")});
    CHECK_MESSAGE(own.output.find("a setting of the server itself") != std::string::npos, own.output);
    const auto unknown = f.job({"submit", f.job_file("unknown.toml", "model = \"lenet99\"\n")});
    CHECK_MESSAGE(unknown.output.find("line 2: model 'lenet99' is neither a zoo model") != std::string::npos,
                  unknown.output);
    CHECK(f.job({"list"}).output.find("no jobs") != std::string::npos);
    CHECK(f.job({"status", "7"}).output.find("no job 7") != std::string::npos);
    // A job that cannot run (a file that is no model spec) fails on its own; the server stays up.
    const auto broken =
        f.job({"submit", f.job_file("broken.toml", "model = \"" + (f.w.dir / "broken.toml").string() + "\"\n")});
    REQUIRE_MESSAGE(broken.status == 0, broken.output);
    REQUIRE_MESSAGE(f.wait_status(1, "failed", 60), (f.status(1) + server.log()));
    CHECK(server.alive());
    // Between jobs the dashboard shows the queue and who waits for the next job.
    httplib::Client dash("127.0.0.1", f.dashboard_port);
    nlohmann::json board;
    // Up to 30 s: the devices come back after the backoff the failed job's start gave them.
    for (int i = 0; i < 300; ++i) {
      if (const auto res = dash.Get("/api/state"); res && res->status == 200) {
        board = nlohmann::json::parse(res->body);
        if (board["phase"] == "between jobs" && board["jobs"].size() == 1 && board["devices"].size() == 2 &&
            board["edges"].size() == 1)
          break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    INFO(board.dump());
    CHECK(board["phase"] == "between jobs");
    REQUIRE(board["jobs"].size() == 1);
    CHECK(board["jobs"][0]["state"] == "failed");
    CHECK(board["devices"].size() == 2);  // devices 1 and 2; 3 and 4 wait behind the edge
    CHECK(board["edges"].size() == 1);
    const auto page = dash.Get("/");
    REQUIRE(page);
    CHECK(page->body.find("\"phase\":\"between jobs\"") != std::string::npos);
    CHECK(server.logged("server: admin admin: submit"));
  }

  SUBCASE("three jobs back to back") {
    // 1: runs to its end.
    const auto j1 = f.job({"submit", f.job_file("one.toml",
                                                "model = \"mlp\"\nrounds = 2\nlocal-steps = 3\n"
                                                "batch = 16\nmin-devices = 4\nno-adapt = true\n"
                                                "dataset = \"digits\"\n")});
    REQUIRE_MESSAGE(j1.status == 0, j1.output);
    CHECK(j1.output.rfind("1\n", 0) == 0);
    REQUIRE_MESSAGE(f.wait_status(1, "done", 120), (f.status(1) + server.log()));
    CHECK(f.status(1).find("4 devices") != std::string::npos);
    const auto got = f.job({"download", "1", "-o", (f.w.dir / "one.safetensors").string()});
    CHECK_MESSAGE(got.status == 0, got.output);
    CHECK(read_safetensors(f.w.dir / "one.safetensors").tensors.size() == 6);  // 3 linear layers
    const auto log1 = f.job({"logs", "1"});
    CHECK(log1.output.find("round 2/2") != std::string::npos);

    // 2: cancelled mid-run; its checkpoint of the last round stays readable.
    const auto j2 = f.job({"submit", f.job_file("two.toml",
                                                "model = \"mlp\"\nrounds = 1000\nlocal-steps = 5\n"
                                                "batch = 16\nmin-devices = 4\nno-adapt = true\n")});
    REQUIRE_MESSAGE(j2.status == 0, j2.output);
    REQUIRE_MESSAGE(f.wait_status(2, "round 2 of 1000", 120), (f.status(2) + server.log()));
    // The dashboard of the job running shows the queue: job 1 done, job 2 running.
    httplib::Client dash("127.0.0.1", f.dashboard_port);
    const auto state = dash.Get("/api/state");
    REQUIRE(state);
    const auto board = nlohmann::json::parse(state->body);
    REQUIRE(board.contains("jobs"));
    CHECK(board["jobs"].size() == 2);
    CHECK(board["jobs"][0]["state"] == "done");
    CHECK(board["jobs"][1]["state"] == "running");
    const auto cancelled = f.job({"cancel", "2"});
    CHECK_MESSAGE(cancelled.output.find("stopping") != std::string::npos, cancelled.output);
    REQUIRE_MESSAGE(f.wait_status(2, "cancelled by admin", 60), f.status(2));
    const auto ck = core::load_checkpoint(f.state / "jobs" / "2" / "model.ckpt");
    CHECK(ck.epoch >= 2);
    CHECK(server.logged("server: admin admin: cancel job 2"));

    // 3: a model device 4 refuses: the job runs with the other three.
    const auto j3 = f.job({"submit", f.job_file("three.toml",
                                                "model = \"lenet5\"\nrounds = 2\nlocal-steps = 3\n"
                                                "batch = 16\nmin-devices = 3\nno-adapt = true\n")});
    REQUIRE_MESSAGE(j3.status == 0, j3.output);
    REQUIRE_MESSAGE(f.wait_status(3, "done", 180), (f.status(3) + server.log()));
    CHECK_MESSAGE(f.status(3).find("3 devices") != std::string::npos, f.status(3));
    CHECK(a4.logged("is not one this device allows"));

    // 4: a data set only device 1 offers: it reloads and trains alone; the others refuse.
    const auto j4 = f.job({"submit", f.job_file("four.toml",
                                                "model = \"mlp\"\nrounds = 8\nlocal-steps = 3\n"
                                                "batch = 16\nmin-devices = 1\nno-adapt = true\n"
                                                "dataset = \"digits2\"\n")});
    REQUIRE_MESSAGE(j4.status == 0, j4.output);
    // Device 2 is refused once it is back from the previous job's end: the job runs 8 rounds, so
    // that it is still running then (1 round could end before that).
    a2.wait_for("this device holds 'digits' (--data-name) and offers no other (--offer)", 30);
    REQUIRE_MESSAGE(f.wait_status(4, "done", 120), (f.status(4) + server.log()));
    CHECK_MESSAGE(f.status(4).find(", 1 devices") != std::string::npos, f.status(4));
    CHECK(a1.logged("the job trains on data set 'digits2': loading it"));
    CHECK(a2.logged("this device holds 'digits' (--data-name) and offers no other (--offer)"));
    const std::string list = f.job({"list"}).output;
    CHECK(list.find("job 1 (one.toml): done") != std::string::npos);
    CHECK(list.find("job 2 (two.toml): cancelled") != std::string::npos);
    CHECK(list.find("job 3 (three.toml): done") != std::string::npos);
    // No node restarted: the same processes served every job.
    for (const auto* n : all) CHECK(n->alive());
    CHECK(a1.count("staying up for the next job") >= 3);
    CHECK(edge.count("staying up for the next job") >= 3);
  }
  // SIGTERM ends every node, staying or not, with status 0.
  for (auto* n : all) ::kill(n->pid(), SIGTERM);
  for (auto* n : all) CHECK(n->exit_code(30) == 0);
}

TEST_CASE("a job server SIGKILLed mid-job resumes the job exactly on restart while its agents stay up") {
  // Rounds of about a second: the kill lands in one, after round 2's checkpoint.
  const std::string job =
      "model = \"mlp\"\nrounds = 5\nlocal-steps = 40\nbatch = 16\nmin-devices = 2\nno-adapt = true\n";
  std::map<std::string, std::string> models[2];  // name -> bytes
  for (int killed = 0; killed < 2; ++killed) {
    CAPTURE(killed);
    fleet f(killed ? "jobs-killed" : "jobs-whole", 2);
    auto server = std::make_unique<node>(f.w, "server", f.server());
    REQUIRE(server->wait_for("waiting for one on", 30));
    node a1(f.w, "agent-1", f.agent(1, false));
    node a2(f.w, "agent-2", f.agent(2, false));
    REQUIRE(f.job({"submit", f.job_file("job.toml", job)}).status == 0);
    if (killed) {
      REQUIRE_MESSAGE(f.wait_status(1, "round 2 of 5", 120), (f.status(1) + server->log()));
      ::kill(server->pid(), SIGKILL);
      CHECK(server->exit_code(10) == -1);
      server = std::make_unique<node>(f.w, "server-again", f.server());
      CHECK_MESSAGE(server->wait_for("resumes where it stopped", 30), server->log());
      CHECK_MESSAGE(server->wait_for("server: resuming from", 30), server->log());
    }
    REQUIRE_MESSAGE(f.wait_status(1, "done", 180), (f.status(1) + server->log()));
    CHECK(a1.alive());
    CHECK(a2.alive());
    REQUIRE(f.job({"download", "1", "-o", (f.w.dir / "model.safetensors").string()}).status == 0);
    for (const auto& [name, t] : read_safetensors(f.w.dir / "model.safetensors").tensors)
      models[killed][name] = t.bytes;
    for (auto* n : {server.get(), &a1, &a2}) ::kill(n->pid(), SIGTERM);
  }
  REQUIRE(models[0].size() == 6);
  for (const auto& [name, bytes] : models[0]) {
    CAPTURE(name);
    CHECK(models[1][name] == bytes);  // bit for bit
  }
}

TEST_CASE(
    "twenty short jobs in a row: every node's memory within 5% of where it was after the second, no "
    "descriptors or threads gained") {
  fleet f("jobs-twenty", 2);
  node server(f.w, "server", f.server());
  REQUIRE(server.wait_for("waiting for one on", 30));
  node edge(f.w, "edge", f.edge());
  node a1(f.w, "agent-1", f.agent(1, false));
  node a2(f.w, "agent-2", f.agent(2, true));
  const std::vector<const node*> all = {&server, &edge, &a1, &a2};
  const std::string job = f.job_file("short.toml",
                                     "model = \"mlp\"\nrounds = 1\nlocal-steps = 3\nbatch = 16\n"
                                     "min-devices = 2\nno-adapt = true\n");
  auto submit = [&] {
    const auto r = f.job({"submit", job});
    REQUIRE_MESSAGE(r.status == 0, (r.output + server.log()));
  };
  // Between jobs, every node settled: the server waiting, the agents and the edge connected to it.
  auto settled_after = [&](int id) {
    REQUIRE_MESSAGE(f.wait_status(id, "done", 120), (f.status(id) + server.log()));
    std::this_thread::sleep_for(std::chrono::seconds(2));
    std::vector<holdings> h;
    for (const auto* n : all) h.push_back(holdings_of(*n));
    return h;
  };
  // The baseline is taken after the second job: the first run leaves a one-time step of glibc's
  // thread caches (about 0.8 MiB of anonymous memory in an agent, none after; flat over 40 jobs),
  // which on these small nodes of 22-27 MiB alone is 3-6%.
  submit();
  const auto after_one = settled_after(1);
  submit();
  const auto first = settled_after(2);
  for (int i = 3; i <= 20; ++i) submit();
  const auto last = settled_after(20);
  const char* names[] = {"server", "edge", "agent 1", "agent 2"};
  for (std::size_t i = 0; i < all.size(); ++i) {
    CAPTURE(names[i]);
    CAPTURE(first[i].rss_kib);
    CAPTURE(last[i].rss_kib);
    CHECK(all[i]->alive());
    CHECK(last[i].rss_kib <= first[i].rss_kib * 105 / 100);
    CHECK(last[i].fds <= first[i].fds);
    CHECK(last[i].threads <= first[i].threads);
  }
  MESSAGE("RSS KiB after job 1, 2 -> 20: server "
          << after_one[0].rss_kib << ", " << first[0].rss_kib << " -> " << last[0].rss_kib << ", edge "
          << after_one[1].rss_kib << ", " << first[1].rss_kib << " -> " << last[1].rss_kib << ", agents "
          << after_one[2].rss_kib << ", " << first[2].rss_kib << " -> " << last[2].rss_kib << ", "
          << after_one[3].rss_kib << ", " << first[3].rss_kib << " -> " << last[3].rss_kib);
}

}  // namespace cleave::testing
