// `cleave demo` at more than its default size, as a user runs it: device processes behind
// several edges, and virtual devices (threads of the demo's process) straight to the server.
// Every device is in every round, and the run ends with its figures.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "run_cleave.h"

namespace {

namespace fs = std::filesystem;
using cleave::testing::run_cleave;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("a demo of 12 device processes behind 3 edges has every device in every round and reports its figures") {
  const fs::path work = fresh_dir("cleave-demo-edges");
  const auto r = run_cleave({"demo", "--no-emulation", "--devices", "12", "--edges", "3", "--rounds", "2",
                             "--local-steps", "1", "--work", work.string()});
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(count(r.output, "round 1/2: 12/12 devices") == 1);
  CHECK(count(r.output, "round 2/2: 12/12 devices") == 1);
  CHECK(count(r.output, "joined through edge-3") == 4);
  CHECK(r.output.find("demo: 12 devices, 3 edges: joined in") != std::string::npos);
  CHECK(r.output.find("demo: device processes peaked at") != std::string::npos);
  CHECK(r.output.find("demo: edge processes peaked at") != std::string::npos);
  CHECK(r.output.find(" left") == std::string::npos);  // nobody drops out, at the end either
  fs::remove_all(work);
}

TEST_CASE("40 virtual devices straight to the server train every round and measure their board once") {
  const fs::path work = fresh_dir("cleave-demo-virtual");
  const auto r = run_cleave({"demo", "--no-emulation", "--devices", "40", "--edges", "0", "--virtual", "--rounds", "2",
                             "--local-steps", "1", "--work", work.string()});
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(count(r.output, "round 1/2: 40/40 devices") == 1);
  CHECK(count(r.output, "round 2/2: 40/40 devices") == 1);
  CHECK(r.output.find("demo: devices: this process peaked at") != std::string::npos);
  const std::string devices = read_file(work / "devices.log");
  CHECK(count(devices, "connected to server") == 40);
  CHECK(count(devices, ": profiled 12 blocks") == 1);
  CHECK(count(devices, ": the block profile of its board") == 39);
  CHECK(count(devices, "training finished after 2 rounds") == 40);
  CHECK(devices.find("warning") == std::string::npos);
  fs::remove_all(work);
}

TEST_CASE(
    "the default demo emulates slow boards on Wi-Fi, keeps blocks on the edge or the server, and compares the plan it "
    "started from") {
  const fs::path work = fresh_dir("cleave-demo-emulated");
  const auto r = run_cleave({"demo", "--rounds", "2", "--local-steps", "30", "--work", work.string()});
  INFO(r.output);
  REQUIRE(r.status == 0);
  // The boards' slowdown is measured against this machine: they train LeNet-5 at 4 GFLOP/s on
  // any machine that serves them at twice that, and at an eighth of its speed on a slower one.
  const auto emulating = r.output.find("demo: emulating 4 boards that train lenet5 at ");
  REQUIRE(emulating != std::string::npos);
  const double board = std::stod(r.output.substr(emulating + 46));
  const auto here = r.output.find(" GFLOP/s (here ", emulating);
  REQUIRE(here != std::string::npos);
  const double host = std::stod(r.output.substr(here + 15));
  CHECK(board <= 4.0);
  CHECK(board == doctest::Approx(std::min(4.0, host / 8)).epsilon(0.05));
  CHECK(r.output.find(",portable: --slowdown ") != std::string::npos);
  const std::string devices = read_file(work / "device-1.log");
  CHECK(devices.find("round 1: link * <-> edge-1: 50 Mbit/s, 5 ms") != std::string::npos);
  // The last round's routes, one line per route: some devices keep blocks on the edge or the
  // server.
  int route_lines = 0, split_lines = 0;
  for (std::size_t at = r.output.find("round 2: device"); at != std::string::npos;
       at = r.output.find("round 2: device", at + 1)) {
    const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
    ++route_lines;
    split_lines += line.find("device[0,12)") == std::string::npos;
  }
  CHECK(route_lines >= 1);
  CHECK(split_lines >= 1);
  CHECK(r.output.find("demo: test accuracy 0.80 ") != std::string::npos);
  // Then the same federation on its first plan, kept, for the time to 0.80 side by side.
  CHECK(r.output.find("demo: the plan it started from (device[0,3) edge[3,8) server[8,12)), kept: test accuracy "
                      "0.80 ") != std::string::npos);
  CHECK(read_file(work / "kept" / "server.log").find("training finished after 2 rounds") != std::string::npos);
  fs::remove_all(work);
}

TEST_CASE("the demo refuses sizes it cannot run, naming the option") {
  auto r = run_cleave({"demo", "--devices", "4", "--slow", "5"});
  CHECK(r.status != 0);
  CHECK(r.output.find("--slow 5: more than --devices") != std::string::npos);
  r = run_cleave({"demo", "--edges", "65"});
  CHECK(r.status != 0);
  CHECK(r.output.find("--edges") != std::string::npos);
  r = run_cleave({"demo", "--board-gflops", "0"});
  CHECK(r.status != 0);
  CHECK(r.output.find("--board-gflops") != std::string::npos);
}

TEST_CASE("an emulated board the machine is slower than runs at the machine's speed, and --slowdown wins") {
  const fs::path work = fresh_dir("cleave-demo-fast-board");
  auto r = run_cleave({"demo", "--rounds", "1", "--local-steps", "3", "--no-compare", "--board-gflops", "100000",
                       "--work", work.string()});
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("demo: emulating 4 boards that train lenet5 at 100000 GFLOP/s (here ") != std::string::npos);
  CHECK(r.output.find(": --slowdown 1.0) on Wi-Fi links to their edge") != std::string::npos);
  fs::remove_all(work);
  r = run_cleave(
      {"demo", "--rounds", "1", "--local-steps", "3", "--no-compare", "--slowdown", "3", "--work", work.string()});
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("demo: emulating 4 boards 3x slower than this machine on Wi-Fi links") != std::string::npos);
  fs::remove_all(work);
}

TEST_CASE("a demo whose edge is killed stops every node and fails naming it") {
  const fs::path work = fresh_dir("cleave-demo-edge-killed");
  // Kills edge-1 once its log shows a device connected, from a thread, while the demo runs.
  std::thread killer([&] {
    for (int i = 0; i < 600; ++i) {
      if (read_file(work / "edge-1.log").find("connected") != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // ("[e]" keeps the pattern from matching the shell that runs it.)
    const std::string cmd = "pkill -9 -f '" + (work / "certs").string() + " --name [e]dge-1 '";
    CHECK(std::system(cmd.c_str()) == 0);
  });
  const auto r = run_cleave({"demo", "--no-emulation", "--devices", "4", "--edges", "2", "--rounds", "200",
                             "--local-steps", "50", "--work", work.string()});
  killer.join();
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK(r.output.find("demo: an edge (pid ") != std::string::npos);
  CHECK(r.output.find("failed (signal 9) before training finished") != std::string::npos);
  CHECK(r.output.find("the run failed") != std::string::npos);
  // No node of the run is left behind.
  const std::string left = "pgrep -f '" + (work / "cert[s]").string() + "' > /dev/null";
  CHECK(std::system(left.c_str()) != 0);
  fs::remove_all(work);
}
