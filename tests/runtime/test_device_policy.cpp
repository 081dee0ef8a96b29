// The device's own policy against the server's plans: a model it does not allow, a route keeping
// fewer blocks on it than it asks, a route whose device blocks train nothing. Each is refused with
// an Error to the server, nothing of the device's data leaves it, and the agent stays up. A route
// needing more memory than the device allows is refused the same way.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "cleave/privacy/digest.h"
#include "cleave/protocol/protocol.h"
#include "federation.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

struct policy_run {
  bool trained = false;  // it sent activations or a replica
  bool up = false;       // still running after `seconds`
  std::string error;     // what ended it, if it ended
};

// A server with `sc` and one agent customised by `customise`, watched for `seconds`.
policy_run run_with_policy(const workspace& w, const std::string& be, server::server_config sc,
                           const std::function<void(device::agent_config&)>& customise, double seconds) {
  std::promise<std::uint16_t> port;
  sc.on_listening = [&](std::uint16_t p) { port.set_value(p); };
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  auto ac = agent_cfg(w, 1, port.get_future().get(), be, "server");
  customise(ac);
  std::atomic<bool> trained = false, ended = false;
  ac.on_send = [&](std::span<const std::byte> f) {
    auto buf = transport::aligned_bytes::allocate(f.size());
    std::memcpy(buf.data(), f.data(), f.size());
    const auto m = transport::decode_frame(std::move(buf), transport::frame_limits{});
    if (m.ok() && (m->type() == wire::Body::Activations || m->type() == wire::Body::ReplicaUpload)) trained = true;
  };
  device::agent a(ac);
  runner ra([&] {
    a.run();
    ended = true;
  });
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  policy_run r;
  r.up = !ended;
  a.stop();
  ra.join();
  srv.stop();
  rs.join();
  r.trained = trained;
  r.error = ra.error();
  return r;
}

}  // namespace

TEST_CASE("a device refuses a plan outside its own policy, sends nothing of its data and stays up") {
  const std::string be = test_backend();
  workspace w("device-policy", 1);
  auto sc = server_cfg(w, be);
  sc.rounds = 1;
  sc.local_steps = 4;
  sc.cuts = {4};
  const auto d = core::load_dataset(w.data.string());
  const std::string lenet = privacy::sha256_hex(core::resolve_model("lenet5", d.train.item, d.train.n_classes).json);
  SUBCASE("a model it does not allow, and then the one it does") {
    auto r = run_with_policy(
        w, be, sc, [](device::agent_config& a) { a.allowed_models = {std::string(64, '0')}; }, 3);
    CHECK_FALSE(r.trained);
    CHECK(r.up);
    CHECK(r.error == "");
    r = run_with_policy(
        w, be, sc,
        [&](device::agent_config& a) {
          a.allowed_models = {std::string(64, 'f'), lenet};
        },
        3);
    CHECK(r.trained);
  }
  SUBCASE("a route keeping fewer blocks on it than its --min-device-blocks") {
    const auto r = run_with_policy(
        w, be, sc, [](device::agent_config& a) { a.min_device_blocks = 5; }, 3);
    CHECK_FALSE(r.trained);
    CHECK(r.up);
  }
  SUBCASE("a route whose device blocks hold no parameters: the input would leave it flattened") {
    sc.model = "mlp";
    sc.cuts = {1};
    const auto r = run_with_policy(
        w, be, sc, [](device::agent_config&) {}, 3);
    CHECK_FALSE(r.trained);
    CHECK(r.up);
  }
  SUBCASE("a route whose device blocks need more than its --memory-budget, before anything is allocated") {
    // LeNet-5's first four blocks at micro-batches of 32 need about 1 MiB (conv1's output alone
    // is 600 KiB).
    const auto r = run_with_policy(
        w, be, sc, [](device::agent_config& a) { a.memory_budget = 256 << 10; }, 3);
    CHECK_FALSE(r.trained);
    CHECK(r.up);
  }
  SUBCASE("a malformed --allow-model is refused at start") {
    device::agent_config ac = agent_cfg(w, 1, 1, be, "server");
    ac.allowed_models = {"abc"};
    CHECK_THROWS_WITH_AS(device::agent{ac}, doctest::Contains("--allow-model 'abc': expected a SHA-256"), core::error);
  }
  SUBCASE("a malformed --offer is refused at start") {
    device::agent_config ac = agent_cfg(w, 1, 1, be, "server");
    for (const char* bad : {"digits", "=dir", "digits="}) {
      ac.offers = {bad};
      CHECK_THROWS_WITH_AS(device::agent{ac}, doctest::Contains("': expected NAME=DIR"), core::error);
    }
  }
}
