// The server's checkpoints: a path that cannot be written is refused before any training; a
// write that fails later is reported, keeps the previous file and training goes on; the file
// is the trainer's format, so a trainer evaluates it to the server's own figures. Evaluation
// every N rounds and on a subset of the test split. `cleave export` reads it too.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>

#include "../support/error_of.h"
#include "../support/safetensors_reader.h"
#include "cleave/core/checkpoint.h"
#include "cleave/core/trainer.h"
#include "federation.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

// A federation of one agent under `sc` (rounds and hooks set by the caller); returns the
// server's error ("" when it ended well).
std::string train_one_device(const workspace& w, const std::string& be, server::server_config sc,
                             std::vector<server::round_report>& reports, std::string* checkpoint_failure = nullptr) {
  std::promise<std::uint16_t> port;
  const auto on_round = sc.on_round;
  sc.on_round = [&reports, on_round](const server::round_report& r) {
    reports.push_back(r);
    if (on_round) on_round(r);
  };
  sc.on_listening = [&port](std::uint16_t p) { port.set_value(p); };
  server::server_node srv(sc);
  runner rs([&] { srv.run(); });
  device::agent a(agent_cfg(w, 1, port.get_future().get(), be, "server"));
  runner ra([&] { a.run(); });
  rs.join();
  ra.join();
  if (checkpoint_failure) *checkpoint_failure = srv.checkpoint_failure();
  return rs.error();
}

// A short run of one small federation, with or without a checkpoint in the workspace.
server::server_config short_run(const workspace& w, const std::string& be, int rounds, int steps,
                                bool checkpoint = true) {
  auto sc = server_cfg(w, be);
  sc.rounds = rounds;
  sc.local_steps = steps;
  sc.batch = 16;
  if (checkpoint) sc.checkpoint = w.dir / "global.ckpt";
  return sc;
}

}  // namespace

TEST_CASE("a checkpoint path that cannot be written is refused before the server listens, naming it") {
  const std::string be = test_backend();
  workspace w("ckpt-path", 1, 256, 64);
  auto sc = server_cfg(w, be);
  bool listened = false;
  sc.on_listening = [&](std::uint16_t) { listened = true; };
  auto refused = [&](const fs::path& p) {
    sc.checkpoint = p;
    server::server_node srv(sc);
    return error_of([&] { srv.run(); });
  };
  CHECK(refused(w.dir / "missing" / "global.ckpt")
            .find("directory '" + (w.dir / "missing").string() + "' does not exist") != std::string::npos);
  fs::create_directories(w.dir / "adir");
  CHECK(refused(w.dir / "adir").find("is a directory") != std::string::npos);
  std::FILE* f = std::fopen((w.dir / "afile").c_str(), "w");
  REQUIRE(f);
  std::fclose(f);
  CHECK(refused(w.dir / "afile" / "global.ckpt").find("is not a directory") != std::string::npos);
  // Nobody, root included, creates files in /proc.
  CHECK(refused("/proc/global.ckpt").find("cannot write in '/proc'") != std::string::npos);
  CHECK_FALSE(listened);
}

TEST_CASE("a checkpoint write that fails in round 2 is reported: round 1's file stays and training goes on") {
  const std::string be = test_backend();
  workspace w("ckpt-fail", 1, 512, 128);
  auto sc = short_run(w, be, 3, 3);
  const fs::path blocker = sc.checkpoint.string() + ".next.tmp";  // where the write goes first
  std::int64_t epoch_before_round3_write = -1;
  sc.on_round = [&](const server::round_report& r) {    // called before the round's checkpoint
    if (r.round == 2) fs::create_directories(blocker);  // round 2's write cannot create its file
    if (r.round == 3) {
      fs::remove_all(blocker);
      epoch_before_round3_write = core::load_checkpoint(sc.checkpoint.string()).epoch;
    }
  };
  std::vector<server::round_report> reports;
  std::string failure;
  CHECK(train_one_device(w, be, sc, reports, &failure) == "");
  CHECK(reports.size() == 3);
  INFO("failure: " << failure);
  CHECK(failure.rfind("round 2: checkpoint '", 0) == 0);
  CHECK(failure.find("cannot create") != std::string::npos);
  CHECK(epoch_before_round3_write == 1);  // round 1's checkpoint, intact and readable
  CHECK(core::load_checkpoint(sc.checkpoint.string()).epoch == 3);
}

TEST_CASE("the server's checkpoint is the trainer's format: a trainer evaluates it to the server's figures") {
  const std::string be = test_backend();
  workspace w("ckpt-eval", 1, 512, 128);
  auto sc = short_run(w, be, 2, 4);
  std::vector<server::round_report> reports;
  REQUIRE(train_one_device(w, be, sc, reports) == "");
  REQUIRE(reports.size() == 2);
  const auto ck = core::load_checkpoint(sc.checkpoint.string());
  CHECK(ck.epoch == 2);
  CHECK(ck.optimizer == "none");
  const auto data = core::load_dataset(w.data.string());
  const auto model = core::parse_model_spec(ck.model_json, "checkpoint");
  auto b = backend::make_backend(be);
  core::trainer t(*b, model, core::train_config{});
  core::restore(t.model_stage(), t.opt(), ck);
  const auto ev = t.evaluate(data.test);
  CHECK(ev.accuracy == doctest::Approx(reports.back().test_accuracy).epsilon(1e-9));
  CHECK(ev.loss == doctest::Approx(reports.back().test_loss).epsilon(1e-6));
}

TEST_CASE(
    "a server's checkpoint exports for PyTorch: the global model with its averaged statistics, no optimizer state") {
  const std::string be = test_backend();
  workspace w("ckpt-export", 1, 256, 64);
  auto sc = short_run(w, be, 2, 2);
  sc.model = "resnet8";
  std::vector<server::round_report> reports;
  REQUIRE(train_one_device(w, be, sc, reports) == "");
  const auto ck = core::load_checkpoint(sc.checkpoint.string());
  const fs::path out = w.dir / "global.safetensors";
  const std::string cmd = std::string(CLEAVE_BINARY) + " export --checkpoint " + sc.checkpoint.string() + " --out " +
                          out.string() + " --model resnet8 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  std::string log;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) log += buf;
  const int status = ::pclose(f);
  INFO(log);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);

  const auto st = read_safetensors(out);
  // conv1, fc (weight and bias), 6 convs in the blocks, 2 projections; 9 batch norms of 5 tensors.
  CHECK(st.tensors.size() == 1 + 2 + 6 + 2 + 9 * 5);
  for (const auto& [name, t] : st.tensors) CHECK(name.find(':') == std::string::npos);  // no "opt:..." state
  auto same = [&](const std::string& torch, const std::string& cleave) {
    const auto* e = ck.find(cleave);
    REQUIRE(e);
    REQUIRE(st.tensors.count(torch));
    return st.tensors.at(torch).bytes ==
           std::string(reinterpret_cast<const char*>(e->values.data()), e->values.size() * sizeof(float));
  };
  CHECK(same("conv1.weight", "p:0.weight"));
  CHECK(same("bn1.running_mean", "s:1.running_mean"));
  CHECK(same("layer3.0.downsample.1.running_var", "s:5.shortcut.1.running_var"));
  CHECK(same("layer2.0.bn2.weight", "p:4.body.4.weight"));
  CHECK(same("fc.bias", "p:7.bias"));
  CHECK(st.metadata.at("step") == std::to_string(2 * 2));  // rounds x local steps
  // How the inputs were normalised: the training split's statistics, as every node used them.
  const auto norm = core::load_dataset(w.data.string()).train.input_normalisation();
  CHECK(st.metadata.at("input_mean").get<std::string>() == norm.at("input_mean"));
  CHECK(st.metadata.at("input_std").get<std::string>() == norm.at("input_std"));
}

TEST_CASE("--eval-every and --eval-samples: skipped rounds say so, subsets are fixed, the last round sees all") {
  const std::string be = test_backend();
  workspace w("ckpt-evalevery", 1, 512, 128);
  auto sc = short_run(w, be, 5, 2, false);
  sc.eval_every = 2;
  sc.eval_samples = 40;
  std::vector<server::round_report> reports;
  REQUIRE(train_one_device(w, be, sc, reports) == "");
  REQUIRE(reports.size() == 5);
  CHECK_FALSE(reports[0].evaluated);
  CHECK(reports[1].evaluated);
  CHECK(reports[1].test_samples == 40);
  CHECK_FALSE(reports[2].evaluated);
  CHECK(reports[2].test_accuracy == reports[1].test_accuracy);  // the last evaluation's, carried
  CHECK(reports[3].evaluated);
  CHECK(reports[3].test_samples == 40);
  CHECK(reports[4].evaluated);  // the last round: the whole split
  CHECK(reports[4].test_samples == 128);
  // 40 samples: every accuracy is a multiple of 1/40.
  for (int i : {1, 3})
    CHECK(std::fabs(reports[i].test_accuracy * 40 - std::round(reports[i].test_accuracy * 40)) < 1e-6);
  sc.eval_every = 0;
  server::server_node bad(sc);
  CHECK(error_of([&] { bad.run(); }).find("eval-every must be >= 1") != std::string::npos);
}

TEST_CASE(
    "--stop-at-accuracy ends training after the round that reaches it, and a resumed run that reached it trains no "
    "more") {
  const std::string be = test_backend();
  workspace w("ckpt-stopat", 1, 512, 128);
  auto sc = short_run(w, be, 6, 3);
  sc.lr_schedule = core::schedule_kind::cosine;  // the schedule still spans the 6 rounds
  std::vector<server::round_report> full;
  REQUIRE(train_one_device(w, be, sc, full) == "");
  REQUIRE(full.size() == 6);
  // The target: round 3's accuracy, where no round before reached it (else the first that did).
  std::size_t first = 0;
  const double target = full[2].test_accuracy;
  while (full[first].test_accuracy < target) ++first;
  REQUIRE(first < 5);
  auto stop = sc;
  stop.fresh = stop.force = true;
  stop.stop_at_accuracy = target;
  std::vector<server::round_report> early;
  REQUIRE(train_one_device(w, be, stop, early) == "");
  REQUIRE(early.size() == first + 1);
  for (std::size_t i = 0; i <= first; ++i) {
    CAPTURE(i);
    CHECK(early[i].learning_rate == full[i].learning_rate);
    CHECK(early[i].test_accuracy == doctest::Approx(full[i].test_accuracy).epsilon(1e-6));
  }
  CHECK(core::load_checkpoint(sc.checkpoint.string()).epoch == static_cast<std::int64_t>(first + 1));
  {
    // Its checkpoint reached the target: nothing to train, no device needed.
    auto resumed = stop;
    resumed.fresh = resumed.force = false;
    server::server_node srv(resumed);
    const auto last = srv.run();
    CHECK(last.round == first + 1);
    CHECK(last.test_accuracy >= target);
  }
  for (double bad : {-0.1, 1.5, std::nan("")}) {
    auto b = sc;
    b.stop_at_accuracy = bad;
    server::server_node srv(b);
    CHECK(error_of([&] { srv.run(); }).find("stop-at-accuracy must be between 0 (off) and 1") != std::string::npos);
  }
}

TEST_CASE("resuming: the same settings continue, other settings are refused naming them, --fresh needs --force") {
  const std::string be = test_backend();
  workspace w("ckpt-resume", 1, 512, 128);
  auto sc = short_run(w, be, 2, 3);
  std::vector<server::round_report> first;
  REQUIRE(train_one_device(w, be, sc, first) == "");
  REQUIRE(first.size() == 2);
  {
    // Finished already: nothing to train, the last round's figures.
    server::server_node srv(sc);
    const auto last = srv.run();
    CHECK(last.round == 2);
    CHECK(last.test_accuracy == doctest::Approx(first.back().test_accuracy).epsilon(1e-6));
  }
  {
    auto other = sc;
    other.local_steps = 4;
    server::server_node srv(other);
    CHECK(error_of([&] { srv.run(); }).find("it was written with local_steps 3, this run has 4") != std::string::npos);
  }
  {
    auto fresh = sc;
    fresh.fresh = true;
    server::server_node srv(fresh);
    CHECK(error_of([&] { srv.run(); }).find("holds round 2 of a run; add --force") != std::string::npos);
  }
  auto more = sc;
  more.rounds = 3;  // one round more, from the checkpoint
  std::vector<server::round_report> resumed;
  REQUIRE(train_one_device(w, be, more, resumed) == "");
  REQUIRE(resumed.size() == 1);
  CHECK(resumed[0].round == 3);
  CHECK(core::load_checkpoint(sc.checkpoint.string()).epoch == 3);
  CHECK(core::load_checkpoint(sc.checkpoint.string() + ".1").epoch == 2);
  CHECK(core::load_checkpoint(sc.checkpoint.string() + ".2").epoch == 1);
  more.fresh = more.force = true;
  std::vector<server::round_report> again;
  REQUIRE(train_one_device(w, be, more, again) == "");
  CHECK(again.size() == 3);
  CHECK(again.front().round == 1);
}

TEST_CASE(
    "a torn newest checkpoint is passed over for the one kept before it, and with none readable resuming is refused") {
  const std::string be = test_backend();
  workspace w("ckpt-torn", 1, 512, 128);
  auto sc = short_run(w, be, 3, 3);
  std::vector<server::round_report> first;
  REQUIRE(train_one_device(w, be, sc, first) == "");
  REQUIRE(first.size() == 3);
  // A power cut on a file system without data journaling: the newest file is half there.
  const auto tear = [](const fs::path& f) { fs::resize_file(f, fs::file_size(f) / 2); };
  tear(sc.checkpoint);
  auto more = sc;
  more.rounds = 4;
  {
    log_capture logs;
    std::vector<server::round_report> resumed;
    REQUIRE(train_one_device(w, be, more, resumed) == "");
    CHECK(logs.count({sc.checkpoint.string() + " is not a checkpoint to resume from", "truncated"}) == 1);
    REQUIRE(resumed.size() == 2);  // from round 2's, kept as .1: rounds 3 and 4
    CHECK(resumed[0].round == 3);
    CHECK(core::load_checkpoint(sc.checkpoint.string()).epoch == 4);
  }
  for (const char* f : {"", ".1", ".2"}) tear(sc.checkpoint.string() + f);
  {
    server::server_node srv(more);
    const std::string e = error_of([&] { srv.run(); });
    CHECK(e.find("cannot resume: no checkpoint there can be read") != std::string::npos);
    CHECK(e.find(sc.checkpoint.string() + ".2: ") != std::string::npos);
    CHECK(e.find("--fresh --force") != std::string::npos);
  }
  more.fresh = more.force = true;
  std::vector<server::round_report> again;
  REQUIRE(train_one_device(w, be, more, again) == "");
  CHECK(again.size() == 4);
  CHECK(again.front().round == 1);
}

TEST_CASE("resuming an adaptive run refuses malformed splitter state, naming the field") {
  const std::string be = test_backend();
  workspace w("ckpt-splitter", 1, 256, 64);
  auto sc = short_run(w, be, 1, 2);
  sc.adaptive = true;
  std::vector<server::round_report> first;
  REQUIRE(train_one_device(w, be, sc, first) == "");
  const std::string path = sc.checkpoint.string();
  const auto good = core::load_checkpoint(path);
  REQUIRE(good.meta.count("route:1") == 1);
  REQUIRE(good.meta.count("route:1:epoch") == 1);
  REQUIRE(good.meta.count("book:profile:device:1:blocks") == 1);
  REQUIRE(good.meta.count("book:profile:server:0:blocks") == 1);
  const std::string plan = good.meta.at("plan_epoch");
  auto more = sc;
  more.rounds = 2;
  // No device comes: a server that got past the resume stops waiting for one at once.
  more.join_timeout_s = 0.2;
  more.exit_on_join_timeout = true;
  // The error of resuming from the good checkpoint with `edit` applied to its fields.
  const auto resume_error = [&](const std::function<void(std::map<std::string, std::string>&)>& edit) {
    auto ck = good;
    edit(ck.meta);
    core::save_checkpoint(path, ck);
    server::server_node srv(more);
    return error_of([&] { srv.run(); });
  };
  const std::string where = "cannot resume from '" + path + "': its round state is incomplete (";
  CHECK(resume_error([](auto& m) { m["route:1"] = "device[0,3"; }) ==
        where + "route:1: route 'device[0,3': expected a segment such as device[0,4))");
  CHECK(resume_error([](auto& m) { m["route:1"] = "device[0,3) server[3,9)"; }) ==
        where + "route:1: route 'device[0,3) server[3,9)': it ends at block 9, the model has 12)");
  CHECK(resume_error([](auto& m) { m.erase("route:1:epoch"); }) == where + "route:1:epoch is missing)");
  CHECK(resume_error([](auto& m) { m["route:1:epoch"] = "99"; }) ==
        where + "route:1:epoch: plan 99 is not between 1 and the checkpoint's plan " + plan + ")");
  CHECK(resume_error([](auto& m) { m["route:x"] = "device[0,3) server[3,12)"; }) ==
        where + "route:x: 'x' is not a count)");
  CHECK(resume_error([](auto& m) { m["book:profile:device:1:blocks"] = "0.1"; }) ==
        where + "book:profile:device:1:blocks (block 0): 1 figures, not 6)");
  // Left as it was written, it resumes (and then waits for its device).
  CHECK(resume_error([](auto&) {}).find("only 0 of 1 devices connected") == 0);
}
