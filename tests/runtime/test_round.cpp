// The server's round on its own: a fake membership and compute side (no sockets, no backend)
// drive it through a round's start, members leaving, attempts run again, robust and secure
// aggregation, and the hand-over to a checkpoint.
#include <doctest/doctest.h>

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "checkpoint_store.h"
#include "cleave/core/error.h"
#include "cleave/core/model.h"
#include "cleave/privacy/masked_replica.h"
#include "cleave/privacy/secagg.h"
#include "cleave/protocol/protocol.h"
#include "cleave/split/plan.h"
#include "round.h"

namespace {

using namespace cleave;
namespace srv = cleave::server;

transport::message decoded(const transport::message_builder& b) {
  auto bytes = transport::aligned_bytes::allocate(b.frame().size());
  std::copy(b.frame().begin(), b.frame().end(), bytes.data());
  auto r = transport::decode_frame(std::move(bytes), {});
  REQUIRE(r.ok());
  return std::move(r).value();
}

struct fake_device {
  float delta = 0;              // its blocks come back as the global ones + delta
  std::uint64_t samples = 100;  // the samples it claims
  bool trains = true;           // answers a RoundStart with its upload
  int session = 0;              // stands for its session: its address is the key
  std::optional<privacy::secagg_client> secure;
  std::vector<float> held;  // its device blocks, kept for masking
  std::uint32_t attempt = 1;
  std::size_t shares_due = 0;  // under secure aggregation it trains once it holds every share
  bool shows_work = true;      // its activations reach the server before its upload
  // The statistics of 64 samples, 48 of them right, mean loss 0.5.
  protocol::round_stats stats = {.loss_sum = 32, .n_loss = 64, .n_correct = 48};
};

// Membership of devices that all run device[0,cut) server[cut,n), their replies to what the round
// sends (each on the I/O thread after the round's own work, as over a channel), and a compute side
// that keeps the server blocks as they are.
class fake_host final : public srv::round_host {
 public:
  fake_host(asio::io_context& io, const core::model_spec& m, int cut, bool secure)
      : io_(io),
        model_(m),
        lay_(core::layout_of(m)),
        cut_(cut),
        secure_(secure),
        route_(split::make_route(false, false, {cut}, m.n_blocks())) {}

  srv::round* round = nullptr;
  std::map<std::uint32_t, fake_device> devices;
  std::set<std::uint32_t> gone;
  std::vector<srv::round_report> reports;
  std::vector<srv::device_routes> handed;
  int installs = 0, discards = 0;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> starts;  // (device, attempt)
  std::function<void(const srv::round_report&)> on_closed;
  std::function<void(std::uint32_t id, std::uint32_t attempt)> on_start;  // after a device's reply
  const srv::global_model* global = nullptr;
  std::uint64_t local_steps = 10;
  std::map<std::uint32_t, std::string> refusals;  // what the round answered an upload with

  std::vector<member> connected() const override {
    std::vector<member> out;
    for (const auto& [id, d] : devices)
      if (!gone.count(id)) out.push_back({id, route_, &d.session});
    return out;
  }
  bool attached(std::uint32_t id, const void* via) const override {
    return devices.count(id) && !gone.count(id) && (!via || via == &devices.at(id).session);
  }
  const split::route& route_of(std::uint32_t) const override { return route_; }
  std::uint32_t plan_epoch() const override { return 1; }
  // A device answers after what the round does now, as over a channel.
  void post(std::uint32_t id, transport::message_builder m) override {
    asio::post(io_, [this, id, m = std::make_shared<transport::message>(decoded(m))] { reply(id, *m); });
  }
  void opening(std::uint64_t) override {}
  std::function<void()> installer(const srv::device_routes&, float, const srv::global_model& g) override {
    global = &g;
    return [this] { ++installs; };
  }
  void gather(const srv::device_routes&, const std::set<std::uint32_t>&, split::aggregator&) override {}
  void discard(const srv::device_routes&) override { ++discards; }
  srv::evaluation evaluate(const srv::global_model&, bool evaluate, bool) override {
    srv::evaluation ev;
    if (evaluate) {
      ev.report.loss = 0.5;
      ev.report.accuracy = 0.75;
      ev.test_samples = 100;
    }
    return ev;
  }
  std::uint64_t bytes_moved() const override { return 0; }
  double predicted_step(const std::set<std::uint32_t>&, std::vector<srv::round_report::leg>*) override { return 0; }
  asio::awaitable<void> closed(const srv::round_report& rep, const srv::device_routes& routes) override {
    reports.push_back(rep);
    handed.push_back(routes);
    if (on_closed) on_closed(rep);
    co_return;
  }

  // Device id's upload of round `number`: its blocks (none under secure aggregation) and its
  // statistics, after an activation of its first step where it shows its work.
  void upload(std::uint32_t id, std::uint64_t number, std::uint32_t attempt) {
    auto& d = devices.at(id);
    if (d.shows_work) round->takes_step(id, number * local_steps, attempt, true);
    const auto n_p = static_cast<std::size_t>(lay_.param_offset[static_cast<std::size_t>(cut_)]);
    const auto n_b = static_cast<std::size_t>(lay_.buffer_offset[static_cast<std::size_t>(cut_)]);
    std::vector<float> p(global->params.begin(), global->params.begin() + static_cast<std::ptrdiff_t>(n_p));
    std::vector<float> b(global->buffers.begin(), global->buffers.begin() + static_cast<std::ptrdiff_t>(n_b));
    for (auto& v : p) v += d.delta;
    d.held = p;
    protocol::replica_desc r;
    r.round = number;
    r.attempt = attempt;
    r.node_id = id;
    r.first_block = 0;
    r.end_block = secure_ ? 0 : static_cast<std::uint32_t>(cut_);
    r.n_samples = d.samples;
    r.devices = std::span(&id, 1);
    r.stats = d.stats;
    const auto m = secure_ ? decoded(protocol::make_replica_upload(r, std::span<const float>{}, {}))
                           : decoded(protocol::make_replica_upload(r, p, b));
    const auto& u = *m.as<wire::ReplicaUpload>();
    try {
      round->on_upload(&d.session, core::tier::device, "device " + std::to_string(id), {id}, u,
                       protocol::replica_weights_of(u, model_));
    } catch (const core::error& e) {
      refusals[id] = e.what();
    }
  }

 private:
  void secagg(std::uint32_t id, const protocol::secagg_desc& d) {
    round->on_secagg(id, *decoded(protocol::make_secagg(d)).as<wire::SecAgg>());
  }

  // What device id does with a message from the round.
  void reply(std::uint32_t id, const transport::message& m) {
    auto& d = devices.at(id);
    if (const auto* rs = m.as<wire::RoundStart>()) {
      starts.emplace_back(id, rs->attempt());
      if (secure_) {
        d.secure.emplace(id, rs->round());
        const privacy::roster_entry mine{id, d.secure->mask_public(), d.secure->encrypt_public()};
        secagg(id,
               {.phase = wire::SecAggPhase::keys, .round = rs->round(), .device_id = id, .keys = std::span(&mine, 1)});
      }
      d.attempt = rs->attempt();
      if (d.trains && !secure_) upload(id, rs->round(), rs->attempt());
      if (on_start) on_start(id, rs->attempt());
      return;
    }
    const auto* s = m.as<wire::SecAgg>();
    REQUIRE(s);
    const std::uint64_t r = s->round();
    switch (s->phase()) {
      case wire::SecAggPhase::roster: {
        const auto roster = protocol::keys_of(*s);
        d.shares_due = roster.size() - 1;
        const auto blobs = d.secure->share_keys(roster, static_cast<int>(s->threshold()));
        secagg(id, {.phase = wire::SecAggPhase::shares, .round = r, .device_id = id, .blobs = blobs});
        break;
      }
      case wire::SecAggPhase::shares:
        for (const auto& b : protocol::blobs_of(*s)) {
          CHECK(d.secure->receive_share(b.id, b.bytes));
          if (--d.shares_due == 0 && d.trains) upload(id, r, d.attempt);
        }
        break;
      case wire::SecAggPhase::mask_set: {
        const auto set = protocol::ids_of(s->devices());
        const auto ranges = protocol::block_ranges_of(*s, model_.n_blocks());
        const privacy::held_segment seg{
            0, cut_, d.held,
            std::vector<float>(static_cast<std::size_t>(lay_.buffer_offset[static_cast<std::size_t>(cut_)]))};
        auto words = privacy::encode_replica(lay_, ranges, std::span(&seg, 1), static_cast<double>(d.samples));
        d.secure->mask(words, set);
        secagg(id, {.phase = wire::SecAggPhase::masked, .round = r, .device_id = id, .words = words});
        break;
      }
      case wire::SecAggPhase::unmask: {
        const auto blobs = d.secure->reveal(protocol::ids_of(s->devices()), protocol::ids_of(s->dropped()));
        secagg(id, {.phase = wire::SecAggPhase::reveal, .round = r, .device_id = id, .blobs = blobs});
        break;
      }
      default:
        FAIL("unexpected secure aggregation phase");
    }
  }

  asio::io_context& io_;
  const core::model_spec& model_;
  core::flat_layout lay_;
  int cut_;
  bool secure_;
  split::route route_;
};

struct rig {
  core::model_spec model = core::resolve_model("mlp", core::shape{1, 8, 8}, 4);
  srv::server_config c;
  runtime::executors ex{"server"};
  runtime::signal wake{ex.io()};
  std::unique_ptr<fake_host> host;
  std::unique_ptr<srv::round> round;
  srv::global_model start, g;
  int cut = 2;

  explicit rig(double deadline_s = 20, bool secure = false, int device_blocks = 2) : cut(device_blocks) {
    c.rounds = 3;
    c.local_steps = 10;
    c.batch = 64;
    c.round_deadline_s = deadline_s;
    c.secure_aggregation = secure;
    core::initial_values(model, 0, model.n_blocks(), 1, start.params, start.buffers);
    g = start;
    host = std::make_unique<fake_host>(ex.io(), model, cut, secure);
    round = std::make_unique<srv::round>(c, model, *host, ex, wake);
    host->round = round.get();
  }
  // Runs `body` on the I/O thread until it returns, then stops.
  void run(std::function<asio::awaitable<void>()> body) {
    auto task = [this, body]() -> asio::awaitable<void> {
      co_await body();
      ex.stop("done");
    };
    ex.spawn(task(), "the test");
    ex.run();
  }
  std::size_t device_values() const {
    return static_cast<std::size_t>(core::layout_of(model).param_offset[static_cast<std::size_t>(cut)]);
  }
  // The largest difference of g's device blocks from the start + delta, and of the server blocks.
  std::pair<double, double> off_by(float delta) const {
    double dev = 0, top = 0;
    for (std::size_t i = 0; i < g.params.size(); ++i) {
      const bool on_device = i < device_values();
      const double want = start.params[i] + (on_device ? delta : 0.0f);
      (on_device ? dev : top) = std::max(on_device ? dev : top, std::abs(g.params[i] - want));
    }
    return {dev, top};
  }
};

}  // namespace

TEST_CASE("a round averages its members' device blocks weighted by their samples and hands the average over once") {
  rig t;
  t.host->devices[1] = {.delta = 1, .samples = 100};
  t.host->devices[2] = {.delta = 3, .samples = 300};
  bool finished = false;
  t.run([&]() -> asio::awaitable<void> { finished = co_await t.round->run(1, 0.1f, t.g); });
  CHECK(finished);
  REQUIRE(t.host->reports.size() == 1);
  const auto& rep = t.host->reports[0];
  CHECK(rep.round == 1);
  CHECK(rep.n_devices == 2);
  CHECK(rep.n_participants == 2);
  CHECK(rep.train_loss == doctest::Approx(0.5));
  CHECK(rep.train_accuracy == doctest::Approx(0.75));
  CHECK(rep.test_accuracy == doctest::Approx(0.75));
  CHECK(t.host->installs == 1);
  CHECK(t.host->handed[0].size() == 2);
  const auto [dev, top] = t.off_by(2.5f);  // (1 x 100 + 3 x 300) / 400
  CHECK(dev < 1e-5);
  CHECK(top == 0);
  CHECK(t.round->phase() == srv::round_phase::idle);
}

TEST_CASE("a member that leaves is counted out and the round closes on the others without waiting for its deadline") {
  rig t(30);
  t.host->devices[1] = {.delta = 1};
  t.host->devices[2] = {.delta = 5, .trains = false};
  bool finished = false, was_in = false;
  const auto t0 = std::chrono::steady_clock::now();
  // Device 2 leaves once its round has started.
  t.host->on_start = [&](std::uint32_t id, std::uint32_t) {
    if (id != 2) return;
    t.host->gone.insert(2);
    was_in = t.round->counted_out(2, false);
    t.wake.notify();
  };
  t.run([&]() -> asio::awaitable<void> { finished = co_await t.round->run(1, 0.1f, t.g); });
  CHECK(was_in);
  CHECK(finished);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  REQUIRE(t.host->reports.size() == 1);
  CHECK(t.host->reports[0].n_devices == 1);
  CHECK(t.host->reports[0].n_participants == 2);
  CHECK(t.off_by(1.0f).first < 1e-5);
}

TEST_CASE("a member silent for a quarter of the deadline is counted out, and one that shows its work stays in") {
  rig t(40);  // a quarter: 10 s
  t.host->devices[1] = {.delta = 1};
  t.host->devices[2] = {.delta = 3, .trains = false};  // slow: profiles every 2 s, its upload at 14 s
  t.host->devices[3] = {.delta = 5, .trains = false};  // silent
  const auto t0 = std::chrono::steady_clock::now();
  bool finished = false;
  t.run([&]() -> asio::awaitable<void> {
    auto slow = [&]() -> asio::awaitable<void> {
      asio::steady_timer timer(co_await asio::this_coro::executor);
      for (int i = 1; i <= 7; ++i) {
        timer.expires_after(std::chrono::seconds(2));
        co_await timer.async_wait(asio::use_awaitable);
        t.round->heard_from(2, 10 + static_cast<std::uint64_t>(i));  // round 1: steps 10-19
        t.round->heard_from(3, 25);  // a step of another round is no sign of this one's work
      }
      t.host->upload(2, 1, 1);
      t.wake.notify();
    };
    t.ex.spawn(slow(), "the slow device");
    finished = co_await t.round->run(1, 0.1f, t.g);
  });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(finished);
  CHECK(took < 30);  // the deadline: 40 s
  CHECK(took > 13);  // device 2 was waited for
  REQUIRE(t.host->reports.size() == 1);
  CHECK(t.host->reports[0].n_devices == 2);
  CHECK(t.host->reports[0].n_participants == 3);
  CHECK_FALSE(t.round->member(3));
  CHECK(t.off_by(2.0f).first < 1e-5);  // (1 + 3) / 2: devices 1 and 2 alike in samples
}

TEST_CASE("a round nobody finishes runs again as its next attempt, and an upload of the earlier attempt is dropped") {
  rig t(0.3);
  t.host->devices[1] = {.delta = 1, .trains = false};
  bool first = true, second = false;
  // In the second attempt the device sends what it had for the first, then its new upload: the
  // first counts for nothing.
  t.host->on_start = [&](std::uint32_t id, std::uint32_t attempt) {
    if (attempt != 2) return;
    t.host->upload(id, 1, 1);
    t.host->upload(id, 1, 2);
  };
  t.run([&]() -> asio::awaitable<void> {
    first = co_await t.round->run(1, 0.1f, t.g);
    CHECK(t.round->attempt() == 1);
    second = co_await t.round->run(1, 0.1f, t.g);
  });
  CHECK_FALSE(first);
  CHECK(second);
  CHECK(t.round->attempt() == 2);
  CHECK(t.host->discards == 1);  // the first attempt's server replicas went
  REQUIRE(t.host->reports.size() == 1);
  CHECK(t.host->reports[0].n_devices == 1);
  CHECK(t.off_by(1.0f).first < 1e-5);
}

TEST_CASE("robust aggregation by median keeps a hostile replica out of the global blocks") {
  rig t;
  t.c.aggregate.kind = split::aggregate_kind::median;
  t.host->devices[1] = {.delta = 1};
  t.host->devices[2] = {.delta = 2};
  t.host->devices[3] = {.delta = 1000};
  t.run([&]() -> asio::awaitable<void> { co_await t.round->run(1, 0.1f, t.g); });
  REQUIRE(t.host->reports.size() == 1);
  CHECK(t.host->reports[0].n_devices == 3);
  CHECK(t.off_by(2.0f).first < 1e-4);
}

TEST_CASE(
    "under secure aggregation the round unmasks only the sum of its members' blocks, and refuses a block in the "
    "clear") {
  rig t(20, true);
  t.host->devices[1] = {.delta = 1, .samples = 100};
  t.host->devices[2] = {.delta = 2, .samples = 100};
  t.host->devices[3] = {.delta = 6, .samples = 200};
  t.run([&]() -> asio::awaitable<void> { co_await t.round->run(1, 0.1f, t.g); });
  REQUIRE(t.host->reports.size() == 1);
  CHECK(t.host->reports[0].secure_devices == 3);
  CHECK(t.host->reports[0].n_devices == 3);
  CHECK(t.off_by(3.75f).first < 1e-3);  // (100 + 200 + 1200) / 400, through fixed-point words

  // A device's blocks in the clear are refused, naming it.
  rig u(0.5, true);
  u.host->devices[1] = {.delta = 1, .trains = false};
  std::string refused;
  u.host->on_start = [&](std::uint32_t id, std::uint32_t) {
    protocol::replica_desc r;
    r.round = 1;
    r.node_id = id;
    r.end_block = 2;
    r.n_samples = 10;
    r.devices = std::span(&id, 1);
    const auto lay = core::layout_of(u.model);
    const auto m =
        decoded(protocol::make_replica_upload(r, std::vector<float>(static_cast<std::size_t>(lay.param_offset[2])),
                                              std::vector<float>(static_cast<std::size_t>(lay.buffer_offset[2]))));
    const auto& up = *m.as<wire::ReplicaUpload>();
    try {
      u.round->on_upload(&u.host->devices[id].session, core::tier::device, "device 1", {id}, up,
                         protocol::replica_weights_of(up, u.model));
    } catch (const core::error& e) {
      refused = e.what();
    }
  };
  u.run([&]() -> asio::awaitable<void> { co_await u.round->run(1, 0.1f, u.g); });
  CHECK(refused ==
        "device 1: replica of round 1 refused: blocks [0, 2) uploaded in the clear under secure aggregation");
}

TEST_CASE("a device's statistics count only when they are possible, and its compute at most the round's wall time") {
  rig t(2);
  const auto with = [](protocol::round_stats s) { return fake_device{.delta = 1, .stats = s}; };
  t.host->devices[1] = with({.loss_sum = 32, .n_loss = 64, .n_correct = 48});
  t.host->devices[2] = with({.loss_sum = 32, .n_loss = 64, .n_correct = 65});    // more right than samples
  t.host->devices[3] = with({.loss_sum = 32, .n_loss = 641, .n_correct = 48});   // 10 steps x 64 allow 640
  t.host->devices[4] = with({.loss_sum = 1e35, .n_loss = 64, .n_correct = 48});  // no training loss
  // (A negative or non-finite loss sum does not pass the frame's checks.)
  t.host->devices[6] = with({.compute_us = 18'000'000'000'000, .loss_sum = 32, .n_loss = 64, .n_correct = 48});
  t.host->devices[7] = with({.device_compute_us = 5'000'000, .loss_sum = 32, .n_loss = 64, .n_correct = 48});
  t.run([&]() -> asio::awaitable<void> { co_await t.round->run(1, 0.1f, t.g); });
  REQUIRE(t.host->reports.size() == 1);
  const auto& rep = t.host->reports[0];
  CHECK(rep.n_devices == 3);  // 1, 6 and 7
  CHECK(rep.train_loss == doctest::Approx(0.5));
  CHECK(rep.train_accuracy == doctest::Approx(0.75));
  // Device 6's 1.8e7 s count as the round's wall time (and a second); device 7 (not an edge) has
  // no devices' compute to report.
  CHECK(rep.device_compute_s <= rep.seconds + 1.0 + 1e-6);
  CHECK(rep.device_compute_s > 0.5);
  CHECK(t.host->refusals.size() == 3);
  CHECK(t.host->refusals[2].find("64 losses, 65 of them correct") != std::string::npos);
  CHECK(t.host->refusals[3].find("641 losses") != std::string::npos);
  CHECK(t.host->refusals[3].find("allow 640 samples") != std::string::npos);
  CHECK(t.host->refusals[4].find("a loss sum of 1e+35 over 64 samples is not a training loss") != std::string::npos);
  CHECK(t.off_by(1.0f).first < 1e-5);  // the refused ones' blocks stay out
}

TEST_CASE("a device is a participant only when the server saw its work: activations, or training alone a new replica") {
  rig t(1);
  t.host->devices[1] = {.delta = 1};
  t.host->devices[2] = {.delta = 3, .shows_work = false};  // a replica, but no activation ever came
  t.run([&]() -> asio::awaitable<void> { co_await t.round->run(1, 0.1f, t.g); });
  REQUIRE(t.host->reports.size() == 1);
  CHECK(t.host->reports[0].n_devices == 1);
  CHECK(t.off_by(1.0f).first < 1e-5);
  CHECK(t.host->refusals[2] ==
        "device 2: replica of round 1 refused: none of its activations of this round reached this tier, yet it "
        "uploads its replica");

  // Every block on the device: no activations; its replica shows its work, unless it is the
  // round's start.
  rig u(1, false, 6);
  REQUIRE(u.model.n_blocks() == 6);
  u.host->devices[1] = {.delta = 2, .shows_work = false};
  u.host->devices[2] = {.delta = 0, .shows_work = false};
  u.run([&]() -> asio::awaitable<void> { co_await u.round->run(1, 0.1f, u.g); });
  REQUIRE(u.host->reports.size() == 1);
  CHECK(u.host->reports[0].n_devices == 1);
  CHECK(u.host->refusals.count(1) == 0);
  CHECK(u.host->refusals[2] ==
        "device 2: replica of round 1 refused: its replica is the one the round started from: it trained nothing");
}

TEST_CASE("a closed round's average and figures go to the checkpoint store, which resumes them at the next round") {
  rig t;
  const auto dir = std::filesystem::temp_directory_path() / "cleave_test_round";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  t.c.checkpoint = dir / "server.ckpt";
  t.host->devices[1] = {.delta = 1};
  srv::checkpoint_store store(t.c, t.model);
  std::string why = "not written";
  t.host->on_closed = [&](const srv::round_report& rep) {
    core::checkpoint ck;
    ck.model_json = t.model.json;
    ck.epoch = static_cast<std::int64_t>(rep.round);
    ck.tensors.push_back({"p:all", core::shape{static_cast<std::int64_t>(t.g.params.size())}, t.g.params});
    const std::map<std::string, std::string> meta{{"run_id", "7"},
                                                  {"plan_epoch", "1"},
                                                  {"test_accuracy", std::to_string(rep.test_accuracy)},
                                                  {"test_loss", std::to_string(rep.test_loss)}};
    why = store.save(std::move(ck), rep.round, {}, meta);
  };
  t.run([&]() -> asio::awaitable<void> { co_await t.round->run(1, 0.1f, t.g); });
  CHECK(why.empty());
  const auto back = store.load();
  REQUIRE(back);
  CHECK(back->ck.epoch == 1);
  CHECK(back->run_id == 7);
  CHECK(back->test_accuracy == doctest::Approx(0.75));
  REQUIRE(back->ck.find("p:all"));
  CHECK(back->ck.find("p:all")->values == t.g.params);  // the averaged model, as the round left it
  std::filesystem::remove_all(dir);
}
