// The nodes of a local federation on threads: start the server, then the edge, then the agents;
// wait for the server; stop whatever is left; report the first failure.
#include "cleave/federation/local_federation.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cleave/core/error.h"
#include "cleave/transport/certs.h"

namespace cleave::federation {

namespace fs = std::filesystem;

void provision_local(const fs::path& certs, int n_devices, int n_edges) {
  if (n_devices < 1 || n_edges < 0)
    throw core::error("a local federation needs at least 1 device and no negative number of edges");
  if (!fs::exists(certs / std::string(transport::ca_cert_file))) transport::init_ca(certs);
  auto issue = [&](const std::string& name, core::tier role) {
    if (fs::exists(certs / (name + ".crt"))) return;
    transport::issue_options io;
    io.role = role;
    transport::issue_certificate(certs, name, io);
  };
  issue("server", core::tier::server);
  for (int i = 1; i <= n_edges; ++i) issue("edge-" + std::to_string(i), core::tier::edge);
  for (int i = 1; i <= n_devices; ++i) issue("device-" + std::to_string(i), core::tier::device);
}

namespace {

// A node's run() on a thread; what it threw is kept for the caller.
class node_thread {
 public:
  template <class F>
  explicit node_thread(F f)
      : t_([this, f = std::move(f)]() mutable {
          try {
            f();
          } catch (...) {
            error_ = std::current_exception();
          }
          done_ = true;
        }) {}
  ~node_thread() { join(); }
  void join() {
    if (t_.joinable()) t_.join();
  }
  bool done() const { return done_; }
  std::exception_ptr error() const { return error_; }

 private:
  std::exception_ptr error_;
  std::atomic<bool> done_{false};
  std::thread t_;
};

template <class ready>
bool wait_until(ready r, double seconds, const node_thread& t) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!r()) {
    if (t.done() || std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace

local_result run_local(local_config c) {
  // Ids left unset are numbered by position; two devices with one id would evict each other.
  std::map<std::uint32_t, std::size_t> by_id;
  for (std::size_t i = 0; i < c.devices.size(); ++i) {
    auto& id = c.devices[i].id;
    if (id == 0) id = static_cast<std::uint32_t>(i + 1);
    if (const auto [at, fresh] = by_id.emplace(id, i); !fresh)
      throw core::error("local federation: devices " + std::to_string(at->second) + " and " + std::to_string(i) +
                        " (by position) both have id " + std::to_string(id) + "; ids must be unique");
  }
  if (c.devices.empty()) throw core::error("a local federation needs at least 1 device");
  local_result out;
  server::server_config& sc = c.server;
  sc.certs = c.certs;
  sc.name = "server";
  sc.listen_host = "127.0.0.1";
  sc.port = 0;
  std::promise<std::uint16_t> listening;
  auto user_round = sc.on_round;
  sc.on_round = [&out, user_round](const server::round_report& r) {
    out.rounds.push_back(r);
    if (user_round) user_round(r);
  };
  sc.on_listening = [&listening](std::uint16_t p) { listening.set_value(p); };
  server::server_node srv(sc);
  node_thread server_thread([&srv] { srv.run(); });
  auto port_future = listening.get_future();
  const bool listens =
      wait_until([&] { return port_future.wait_for(std::chrono::seconds(0)) == std::future_status::ready; },
                 c.start_timeout_s, server_thread);
  if (!listens) {
    srv.stop();
    server_thread.join();
    if (server_thread.error()) std::rethrow_exception(server_thread.error());
    throw core::error("local federation: the server did not start listening");
  }
  std::uint16_t up_port = port_future.get();
  std::string up_name = "server";

  std::unique_ptr<edge::edge_node> edge;
  std::unique_ptr<node_thread> edge_thread;
  auto stop_all = [&](std::vector<std::unique_ptr<device::agent>>& agents) {
    for (auto& a : agents) a->stop();
    if (edge) edge->stop();
    srv.stop();
  };
  if (c.use_edge) {
    edge::edge_config& ec = c.edge;
    ec.certs = c.certs;
    ec.name = "edge-1";
    ec.listen_host = "127.0.0.1";
    ec.port = 0;
    ec.upstream_host = "127.0.0.1";
    ec.upstream_port = up_port;
    ec.upstream_name = "server";
    edge = std::make_unique<edge::edge_node>(ec);
    edge_thread = std::make_unique<node_thread>([e = edge.get()] { e->run(); });
    if (!wait_until([&] { return edge->port() != 0; }, c.start_timeout_s, *edge_thread)) {
      edge->stop();
      srv.stop();
      edge_thread->join();
      server_thread.join();
      if (edge_thread->error()) std::rethrow_exception(edge_thread->error());
      throw core::error("local federation: the edge did not start listening");
    }
    up_port = edge->port();
    up_name = "edge-1";
  }

  std::vector<std::unique_ptr<device::agent>> agents;
  std::vector<std::unique_ptr<node_thread>> agent_threads;
  for (std::size_t i = 0; i < c.devices.size(); ++i) {
    device::agent_config a = c.devices[i];
    a.certs = c.certs;
    a.name = "device-" + std::to_string(a.id);
    a.upstream_host = "127.0.0.1";
    a.upstream_port = up_port;
    a.upstream_name = up_name;
    agents.push_back(std::make_unique<device::agent>(std::move(a)));
    agent_threads.push_back(std::make_unique<node_thread>([ag = agents.back().get()] { ag->run(); }));
  }

  // The server ends the run; a node failing before that ends it for everyone.
  std::exception_ptr failure;
  while (!server_thread.done()) {
    for (const auto& t : agent_threads)
      if (t->done() && t->error() && !failure) failure = t->error();
    if (edge_thread && edge_thread->done() && edge_thread->error() && !failure) failure = edge_thread->error();
    if (failure) {
      stop_all(agents);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  server_thread.join();
  if (!failure && server_thread.error()) failure = server_thread.error();
  // The agents and the edge end when the server tells them the run is over; any still running
  // (one that never got in) is stopped after a grace period.
  const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto all_done = [&] {
    for (const auto& t : agent_threads)
      if (!t->done()) return false;
    return !edge_thread || edge_thread->done();
  };
  while (!failure && !all_done() && std::chrono::steady_clock::now() < grace)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop_all(agents);
  for (auto& t : agent_threads) t->join();
  if (edge_thread) edge_thread->join();
  if (failure) std::rethrow_exception(failure);
  out.global_params = srv.global_params();
  return out;
}

}  // namespace cleave::federation
