// Faults: a device killed mid-round, a device that sends out-of-plan or malformed messages.
// The round completes without it, the server keeps serving the others.
#include <doctest/doctest.h>

#include <asio/co_spawn.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <cstdio>
#include <future>
#include <optional>

#include "../support/error_of.h"
#include "cleave/core/model.h"
#include "cleave/protocol/protocol.h"
#include "cleave/transport/connect.h"
#include "cleave/transport/listener.h"
#include "federation.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

// Device `device`'s activation of two zero samples (with labels) entering `block`.
transport::message_builder activation_of(core::backend& b, std::uint32_t epoch, std::uint64_t step, std::uint32_t block,
                                         const core::shape& in, std::uint32_t device = 1) {
  core::tensor x = b.zeros(in.batched(2));
  core::tensor y = b.zeros({2}, core::dtype::i32);
  const protocol::step_key key{epoch, step, 0, device, block};
  return protocol::make_activations(key, {2, 1}, b, x, &y);
}

// Reads ch until a Plan arrives: its epoch, or what ended the wait.
asio::awaitable<std::string> plan_epoch(transport::channel& ch, std::uint32_t& epoch) {
  for (;;) {
    auto m = co_await ch.receive();
    if (!m) co_return "closed: " + m.error().reason();
    if (const auto* e = m->as<cleave::wire::Error>()) co_return "error: " + (e->message() ? e->message()->str() : "");
    if (const auto* p = m->as<cleave::wire::Plan>()) {
      epoch = p->epoch();
      co_return "";
    }
  }
}

}  // namespace

TEST_CASE("a device killed mid-round is left out of that round and rejoins a later one") {
  const std::string be = test_backend();
  workspace w("kill", 2);
  auto sc = server_cfg(w, be);
  sc.rounds = 6;
  sc.local_steps = 30;
  sc.min_devices = 2;
  sc.round_deadline_s = 30;
  std::mutex mu;
  std::vector<server::round_report> reports;
  sc.on_round = [&](const server::round_report& r) {
    std::lock_guard lock(mu);
    reports.push_back(r);
  };
  std::promise<std::uint16_t> port;
  sc.on_listening = [&](std::uint16_t p) { port.set_value(p); };
  std::promise<void> started;
  sc.on_round_start = [&](std::uint64_t round, int) {
    if (round == 1) started.set_value();
  };
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  const auto sp = port.get_future().get();
  // Device 1 is slow (30 steps take it seconds, so it is surely mid-round when killed).
  pid_t slow = spawn_agent(w, 1, sp, be, 200.0);
  const pid_t fast = spawn_agent(w, 2, sp, be, 1.0);
  started.get_future().wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  {
    std::lock_guard lock(mu);
    REQUIRE(reports.empty());  // still in round 1
  }
  ::kill(slow, SIGKILL);
  ::waitpid(slow, nullptr, 0);
  slow = spawn_agent(w, 1, sp, be, 1.0);  // restarted, at full speed
  rs.join();
  CHECK(rs.error() == "");
  int status = 0;
  CHECK(exited_within(slow, 30, status));
  CHECK(WIFEXITED(status));
  CHECK(exited_within(fast, 30, status));
  CHECK(WIFEXITED(status));
  REQUIRE(reports.size() == 6);
  CHECK(reports[0].n_participants == 2);
  CHECK(reports[0].n_devices == 1);
  bool rejoined = false;
  for (std::size_t i = 1; i < reports.size(); ++i) rejoined |= reports[i].n_devices == 2;
  CHECK(rejoined);
}

TEST_CASE("a device sending an out-of-plan or malformed message is disconnected and the others train on") {
  const std::string be = test_backend();
  workspace w("rogue", 3);
  auto sc = server_cfg(w, be);
  sc.local_steps = 10;
  // Two rogue devices: one (2) sends activations for a block outside its plan once its round
  // starts, the other (3) a frame of garbage. Each must see its channel closed by the server.
  const auto run =
      run_with_rogues(w, be, sc, [](transport::channel& ch, std::uint32_t id) -> asio::awaitable<std::string> {
        for (;;) {
          auto m = co_await ch.receive();
          if (!m) co_return "closed: " + m.error().reason();
          if (!m->as<cleave::wire::RoundStart>()) continue;
          if (id == 3) {
            std::vector<std::byte> junk(64, std::byte{0x5a});
            junk[0] = std::byte{60};  // a plausible length prefix, then nonsense
            junk[1] = junk[2] = junk[3] = std::byte{0};
            co_await ch.send(transport::message_builder::from_frame(junk));
          } else {
            auto b = backend::make_backend("reference");
            core::tensor x = b->zeros({2, 4});
            const protocol::step_key key{1, 10, 0, id, 9};
            co_await ch.send(protocol::make_activations(key, {2, 1}, *b, x, nullptr));
          }
        }
      });
  INFO("out-of-plan rogue: " << run.rogue2 << "; malformed rogue: " << run.rogue3);
  CHECK(run.rogue2.rfind("closed", 0) == 0);
  CHECK(run.rogue3.rfind("closed", 0) == 0);
  CHECK(run.server_error == "");
  REQUIRE(run.reports.size() == 1);
  CHECK(run.reports[0].n_participants == 3);
  CHECK(run.reports[0].n_devices == 1);
  CHECK(run.reports[0].test_accuracy > 0.0);
}

TEST_CASE("after a re-split, step messages of the old plan epoch are refused and the channel stays open") {
  const std::string be = test_backend();
  workspace w("stale", 1);
  auto sc = server_cfg(w, be);
  sc.rounds = 1;
  sc.local_steps = 2;
  sc.round_deadline_s = 5;
  sc.cuts = {3};
  const auto moved = split::make_route(false, false, {5}, 12);
  sc.force_route = [&](std::uint32_t, std::uint64_t, const split::route& current) -> std::optional<split::route> {
    return current == moved ? std::nullopt : std::optional<split::route>(moved);
  };
  std::promise<std::uint16_t> port;
  sc.on_listening = [&](std::uint16_t p) { port.set_value(p); };
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  const auto sp = port.get_future().get();

  asio::io_context io;
  const transport::tls_context tls(transport::tls_files_in(w.certs, "device-1"));
  auto device = [&]() -> asio::awaitable<std::string> {
    auto ch = co_await hello_as(tls, sp, 1);
    if (!ch) co_return "connect failed: " + ch.error().reason();
    auto b = backend::make_backend("reference");
    const core::shape pool1{6, 14, 14}, conv2{16, 10, 10};
    std::uint32_t epoch = 0, new_epoch = 0;
    std::uint64_t step = 0;
    bool migrated = false;
    for (;;) {
      auto m = co_await ch->receive();
      if (!m) co_return "closed: " + m.error().reason();
      if (const auto* p = m->as<cleave::wire::Plan>()) {
        if (!p->resplit()) {
          epoch = p->epoch();
          continue;
        }
        // The re-split: switch at the next step boundary.
        new_epoch = p->epoch();
        co_await ch->send(protocol::make_cutover(1, new_epoch, step + 1));
      } else if (const auto* r = m->as<cleave::wire::RoundStart>()) {
        step = r->round() * r->local_steps();
        co_await ch->send(activation_of(*b, epoch, step, 3, pool1));
      } else if (const auto* mg = m->as<cleave::wire::Migrate>()) {
        if (mg->first_block() != 3 || mg->end_block() != 5) co_return std::string("unexpected blocks moved");
        migrated = true;
        // A late message of the old plan.
        co_await ch->send(activation_of(*b, epoch, step + 1, 3, pool1));
      } else if (const auto* e = m->as<cleave::wire::Error>()) {
        const std::string text = e->message() ? e->message()->str() : "";
        if (e->code() != cleave::wire::ErrorCode::stale_epoch) co_return "error: " + text;
        // Still served: the current epoch's message goes through.
        if (!ch->is_open()) co_return std::string("closed after the refusal");
        co_await ch->send(activation_of(*b, new_epoch, step + 1, 5, conv2));
        auto g = co_await ch->receive();
        while (g && !g->as<cleave::wire::Gradients>()) g = co_await ch->receive();
        if (!g) co_return "closed: " + g.error().reason();
        co_return std::string(migrated ? "migrated, " : "") + "refused: " + text + "; served epoch " +
            std::to_string(g->as<cleave::wire::Gradients>()->epoch());
      }
    }
  };
  auto f = asio::co_spawn(io, device(), asio::use_future);
  std::thread io_thread([&] { io.run(); });
  const std::string got = f.get();
  io_thread.join();
  INFO(got);
  CHECK(got.rfind("migrated, refused: plan epoch", 0) == 0);
  CHECK(got.find("served epoch 2") != std::string::npos);
  srv.stop();
  rs.join();
}

TEST_CASE("a device holding every block that sends its logits up anyway is refused naming the route") {
  const std::string be = test_backend();
  workspace w("past-loss", 1);
  auto sc = server_cfg(w, be);
  sc.rounds = 1;
  sc.local_steps = 2;
  sc.round_deadline_s = 5;
  sc.cuts = {12};  // every block on the device: its loss is computed there
  log_capture log;
  std::promise<std::uint16_t> port;
  sc.on_listening = [&](std::uint16_t p) { port.set_value(p); };
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  const auto sp = port.get_future().get();

  asio::io_context io;
  const transport::tls_context tls(transport::tls_files_in(w.certs, "device-1"));
  auto device = [&]() -> asio::awaitable<std::string> {
    auto ch = co_await hello_as(tls, sp, 1);
    if (!ch) co_return "connect failed: " + ch.error().reason();
    auto b = backend::make_backend("reference");
    const core::shape logits{10};
    std::uint32_t epoch = 0;
    for (;;) {
      auto m = co_await ch->receive();
      if (!m) co_return "closed: " + m.error().reason();
      if (const auto* p = m->as<cleave::wire::Plan>()) {
        epoch = p->epoch();
      } else if (const auto* r = m->as<cleave::wire::RoundStart>()) {
        co_await ch->send(activation_of(*b, epoch, r->round() * r->local_steps(), 12, logits));
      } else if (const auto* e = m->as<cleave::wire::Error>()) {
        const std::string text = e->message() ? e->message()->str() : "";
        co_return "error: " + text;
      }
    }
  };
  auto f = asio::co_spawn(io, device(), asio::use_future);
  std::thread io_thread([&] { io.run(); });
  const std::string got = f.get();
  io_thread.join();
  INFO(got);
  CHECK(got.rfind("closed", 0) == 0);
  CHECK(log.count({"device 1", "activation for block 12 past the loss of route device[0,12) server[12,12)"}) >= 1);
  srv.stop();
  rs.join();
}

TEST_CASE("bad sizes, schedules and backends on the command line are refused with the reason") {
  auto run = [](const std::string& args) {
    std::string out;
    FILE* f = ::popen((std::string(CLEAVE_BINARY) + " " + args + " 2>&1").c_str(), "r");
    REQUIRE(f != nullptr);
    char buf[512];
    while (std::fgets(buf, sizeof buf, f)) out += buf;
    const int status = ::pclose(f);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) != 0);
    return out;
  };
  CHECK(run("agent --certs /nonexistent --id 1 --memory-budget 5Q").find("--memory-budget '5Q'") != std::string::npos);
  CHECK(run("server --certs /nonexistent --memory-budget -1G").find("--memory-budget '-1G'") != std::string::npos);
  CHECK(run("edge --certs /nonexistent --schedule 'at x link device-1 edge-1 1Mbit/s'")
            .find("round 'x' is not a number") != std::string::npos);
  CHECK(run("demo --device-backends onednn,foo").find("--device-backends 'onednn,foo': unknown backend 'foo'") !=
        std::string::npos);
  CHECK(run("demo --lr-schedule linear").find("unknown learning-rate schedule 'linear'") != std::string::npos);
  CHECK(run("server --certs /nonexistent --lr-schedule linear").find("unknown learning-rate schedule 'linear'") !=
        std::string::npos);
  CHECK(run("server --certs /nonexistent --rounds 3 --warmup-rounds 3")
            .find("warm-up rounds must be >= 0 and fewer than the rounds") != std::string::npos);
}

TEST_CASE("a device id is bound to the certificate: an impostor is refused and cannot evict the real device") {
  const std::string be = test_backend();
  workspace w("impostor", 2);
  // The agent itself refuses a configuration whose id is not its certificate's.
  auto wrong = agent_cfg(w, 1, 1, be, "server");
  wrong.id = 2;
  device::agent misconfigured(wrong);
  CHECK(error_of([&] { misconfigured.run(); }) ==
        "device id 2 does not match certificate 'device-1' (it is for device 1)");

  auto sc = server_cfg(w, be);
  sc.rounds = 2;
  sc.local_steps = 10;
  std::vector<server::round_report> reports;
  std::promise<std::uint16_t> port;
  record(sc, reports, port);
  round_started round1(1);
  sc.on_round_start = round1.hook();
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  const auto sp = port.get_future().get();
  // device-2's certificate claiming device 1: refused with the reason every time, before device 1
  // joins (no lock-out) and while it trains (no eviction).
  const transport::tls_context tls2(transport::tls_files_in(w.certs, "device-2"));
  auto impostor = [&]() -> asio::awaitable<std::string> {
    std::string said;
    for (int i = 0; i < 3; ++i) {
      auto ch = co_await hello_as(tls2, sp, 1);
      if (!ch) co_return "connect failed: " + ch.error().reason();
      auto m = co_await ch->receive();
      if (!m || !m->as<cleave::wire::Error>()) co_return "not refused";
      said = m->as<cleave::wire::Error>()->message()->str();
      co_await ch->close();
    }
    co_return said;
  };
  auto attempt = [&] {
    asio::io_context io;
    auto f = asio::co_spawn(io, impostor(), asio::use_future);
    io.run();
    return f.get();
  };
  const std::string refusal = "Hello claims device id 1 but certificate 'device-2' is for device 2";
  CHECK(attempt() == refusal);
  device::agent real(agent_cfg(w, 1, sp, be, "server"));
  runner rr([&] { real.run(); });
  REQUIRE(round1.wait(60));
  CHECK(attempt() == refusal);
  rs.join();
  rr.join();
  CHECK(rs.error() == "");
  REQUIRE(reports.size() == 2);
  for (const auto& r : reports) CHECK(r.n_devices == 1);
}

TEST_CASE("a node refused at every attempt waits a second or more between attempts and stops after five") {
  const std::string be = test_backend();
  workspace w("refused", 1);
  auto sc = server_cfg(w, be);
  sc.rounds = 1;
  std::promise<std::uint16_t> port;
  sc.on_listening = [&](std::uint16_t p) { port.set_value(p); };
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  const auto sp = port.get_future().get();
  // An agent holding an edge's certificate: the server refuses its Hello every time.
  auto a = agent_cfg(w, 1, sp, be, "server");
  a.name = "edge-1";
  device::agent wrong(a);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { wrong.run(); });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(e ==
        "refused by server 5 times in a row: Hello claims role device but the certificate says edge (check this node's "
        "certificate, its id and the upstream's allowed names)");
  CHECK(secs >= 4.0);  // four waits of at least one second
  srv.stop();
  rs.join();
}

TEST_CASE("a node that cannot reach its upstream logs its first attempts, then summaries, and the outage once back") {
  const std::string be = test_backend();
  workspace w("unreachable", 1);
  const std::uint16_t port = transport::free_loopback_port();  // nothing listens there yet
  auto a = agent_cfg(w, 1, port, be, "");
  a.links.reconnect_max_s = 0.1;
  log_capture logs;
  device::agent agent(a);
  runner ra([&] { agent.run(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // ten attempts or more
  // Each of the first three, then nothing until a summary 30 s in: an outage of hours stays readable.
  CHECK(logs.count({"device 1: cannot reach 127.0.0.1:" + std::to_string(port)}) == 3);
  CHECK(logs.count({"cannot reach", "(further attempts are summarised)"}) == 1);
  CHECK(logs.count({"still cannot reach"}) == 0);
  auto sc = server_cfg(w, be);
  sc.port = port;
  sc.rounds = 1;
  sc.local_steps = 2;
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  rs.join();
  ra.join();
  CHECK(rs.error() == "");
  CHECK(ra.error() == "");
  CHECK(logs.count({"device 1: connected to server", "failed attempts over"}, spdlog::level::info) == 1);
}

TEST_CASE("with --give-up-after a node stops with an error once its upstream stays unreachable that long") {
  const std::string be = test_backend();
  workspace w("give-up", 1);
  const std::uint16_t port = transport::free_loopback_port();  // nothing listens there
  auto a = agent_cfg(w, 1, port, be, "");
  a.links.reconnect_max_s = 0.2;
  a.links.give_up_s = 1;
  device::agent agent(a);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { agent.run(); });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(e.find("cannot reach 127.0.0.1:" + std::to_string(port) + " for 1 s (") == 0);
  CHECK(e.find("attempts; --give-up-after 1): cannot connect to 127.0.0.1:" + std::to_string(port)) !=
        std::string::npos);
  CHECK(secs >= 1.0);
  CHECK(secs < 10.0);
}

TEST_CASE("what an edge still sends for a device that left through it is dropped, after it joined elsewhere too") {
  const std::string be = test_backend();
  workspace w("late-edge", 3);
  auto sc = server_cfg(w, be);
  sc.rounds = 1;
  sc.min_devices = 3;  // no round starts: only the joins and the late message matter
  sc.cuts = {3};
  std::promise<std::uint16_t> port;
  sc.on_listening = [&](std::uint16_t p) { port.set_value(p); };
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  const auto sp = port.get_future().get();

  asio::io_context io;
  const transport::tls_context edge_tls(transport::tls_files_in(w.certs, "edge-1"));
  const transport::tls_context dev_tls(transport::tls_files_in(w.certs, "device-2"));
  auto play = [&]() -> asio::awaitable<std::string> {
    auto edge = co_await transport::connect(edge_tls, "127.0.0.1", sp);
    if (!edge) co_return "edge connect failed: " + edge.error().reason();
    protocol::hello_info eh;
    eh.role = core::tier::edge;
    eh.node_id = 1000;
    co_await edge->send(protocol::make_hello(eh));
    // Device 2 joins through the edge, then leaves it (its Wi-Fi to the edge dropped).
    protocol::hello_info dh;
    dh.role = core::tier::device;
    dh.node_id = 2;
    co_await edge->send(protocol::make_hello(dh));
    std::uint32_t epoch = 0;
    if (auto why = co_await plan_epoch(*edge, epoch); !why.empty()) co_return "edge: " + why;
    // (Named first: g++ 12 mishandles aggregate temporaries inside a co_await expression.)
    auto leave = protocol::make_leave({2, "link lost"});
    co_await edge->send(std::move(leave));
    // It joins again straight to the server (retried until the server has taken the Leave).
    std::optional<transport::channel> direct;
    for (int attempt = 0; attempt < 100 && !direct; ++attempt) {
      auto ch = co_await hello_as(dev_tls, sp, 2);
      if (!ch) co_return "device connect failed: " + ch.error().reason();
      std::uint32_t e = 0;
      if ((co_await plan_epoch(*ch, e)).empty()) {
        direct.emplace(std::move(*ch));
      } else {
        asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(20));
        co_await t.async_wait(asio::use_awaitable);
      }
    }
    if (!direct) co_return std::string("device 2 never joined directly");
    // What the edge computed for device 2 before it knew: late, not a lie.
    auto b = backend::make_backend("reference");
    const core::shape pool1{6, 14, 14};
    auto late = activation_of(*b, epoch, 0, 3, pool1, 2);
    co_await edge->send(std::move(late));
    // The edge is still served: device 3 joins through it.
    dh.node_id = 3;
    co_await edge->send(protocol::make_hello(dh));
    if (auto why = co_await plan_epoch(*edge, epoch); !why.empty()) co_return "edge after the late message: " + why;
    co_return std::string("served");
  };
  auto f = asio::co_spawn(io, play(), asio::use_future);
  std::thread io_thread([&] { io.run(); });
  const std::string got = f.get();
  io_thread.join();
  CHECK(got == "served");
  srv.stop();
  rs.join();
  CHECK(rs.error() == "");  // stopped before any round: a clean end too (its report is round 0)
}

TEST_CASE("a step message the server sent under a plan the edge has left behind is dropped: the edge keeps its link") {
  const std::string be = test_backend();
  workspace w("late-server", 2);
  asio::io_context io;
  // The server, scripted: it announces device 2 under plan 2, then sends a gradient of plan 1.
  transport::listener up_listener(io.get_executor(), transport::tls_context(transport::tls_files_in(w.certs, "server")),
                                  {asio::ip::make_address("127.0.0.1"), 0});
  auto edge = start_edge(w, be, up_listener.port());
  const transport::tls_context dev_tls(transport::tls_files_in(w.certs, "device-2"));
  const auto model = core::resolve_model("lenet5", core::shape{1, 28, 28}, 10);
  // A run that does not get what it waits for ends after 20 s (the device's link closed).
  transport::channel* dev_ch = nullptr;
  asio::steady_timer watchdog(io, std::chrono::seconds(20));
  auto guard = [&]() -> asio::awaitable<void> {
    auto [ec] = co_await watchdog.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    if (!ec && dev_ch) co_await dev_ch->close();
  };
  auto play = [&]() -> asio::awaitable<std::string> {
    auto up = co_await up_listener.accept();
    if (!up) co_return "no edge: " + up.error().reason();
    auto hello = co_await up->receive();
    if (!hello || !hello->as<cleave::wire::Hello>()) co_return std::string("no Hello from the edge");
    protocol::welcome_info ew;
    ew.node_id = 1000;
    co_await up->send(protocol::make_welcome(ew));
    auto dev = co_await hello_as(dev_tls, edge.port, 2);
    if (!dev) co_return "device connect failed: " + dev.error().reason();
    dev_ch = &*dev;
    for (;;) {  // the device's Hello, relayed
      auto m = co_await up->receive();
      if (!m) co_return "closed: " + m.error().reason();
      if (const auto* h = m->as<cleave::wire::Hello>(); h && h->node_id() == 2) break;
    }
    protocol::welcome_info dw;
    dw.node_id = 2;
    co_await up->send(protocol::make_welcome(dw));
    protocol::plan_desc p;
    p.epoch = 2;
    p.model_json = model.json;
    p.micro_batch_size = 2;
    p.device_id = 2;
    p.edge_id = 1000;
    p.route = split::make_route(false, true, {3, 8}, model.n_blocks());
    co_await up->send(protocol::make_plan(p));
    // A gradient of plan 1 for device 2: sent before the server's plan 2, and late.
    auto b = backend::make_backend("reference");
    const core::tensor g = b->zeros({2, 4});
    const protocol::step_key key{1, 0, 0, 2, 8};
    auto stale = protocol::make_gradients(key, *b, g, 0.5f, 0);
    co_await up->send(std::move(stale));
    // What follows on the same link reaches the device: the edge took the gradient and kept it.
    co_await up->send(protocol::make_welcome(dw));
    for (int welcomes = 0; welcomes < 2;) {
      auto m = co_await dev->receive();
      if (!m) co_return "device: closed: " + m.error().reason();
      welcomes += m->as<cleave::wire::Welcome>() != nullptr;
    }
    // And the other way: device 2's profile reaches the server.
    split::node_profile prof;
    prof.node_id = 2;
    auto report = protocol::make_profile(prof, 2, 0);
    co_await dev->send(std::move(report));
    for (;;) {
      auto m = co_await up->receive();
      if (!m) co_return "closed: " + m.error().reason();
      if (const auto* e = m->as<cleave::wire::Error>()) co_return "error: " + (e->message() ? e->message()->str() : "");
      if (const auto* pr = m->as<cleave::wire::Profile>(); pr && pr->node_id() == 2) co_return std::string("relayed");
    }
  };
  auto f = asio::co_spawn(io, play(), asio::use_future);
  auto fg = asio::co_spawn(io, guard(), asio::use_future);
  std::thread io_thread([&] { io.run(); });
  const std::string got = f.get();
  asio::post(io, [&] { watchdog.cancel(); });
  fg.wait();
  edge.node->stop();
  io.stop();
  io_thread.join();
  CHECK(got == "relayed");
}
