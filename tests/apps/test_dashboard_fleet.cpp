// The dashboard of a fleet: `cleave demo` with 200 virtual devices behind 4 edges trains with
// the dashboard on, and headless Chromium loads the page while the devices train. The page must
// draw its first state in under a second and stay bounded (the device table paged, the
// topology grouped per edge, the cuts on one canvas): about 2,000 elements where a row and a
// node per device would be over 6,000. The API's state carries each device's state and progress
// in the round and the re-splits with their predicted gain. The screenshot is kept as the test's
// artefact (docs/dashboard-fleet.png is one). Without Chromium the test is skipped (exit 77),
// unless CLEAVE_REQUIRE_BROWSER is set.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chromium.h"
#include "cleave/transport/listener.h"

namespace {

namespace fs = std::filesystem;
using namespace cleave::testing;

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// `cleave demo` in a process group of its own (its server and edges with it), its output in a file;
// stopped and reaped when the test ends, however it ends.
class demo_process {
 public:
  demo_process(const std::vector<std::string>& args, const fs::path& out) {
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::setpgid(0, 0);
      const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      std::vector<char*> argv{const_cast<char*>(CLEAVE_BINARY)};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(CLEAVE_BINARY, argv.data());
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
  }
  ~demo_process() { stop(); }
  bool running() { return pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0; }
  // SIGTERM (the demo forwards it to its nodes), then SIGKILL to the group after 30 s.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 300 && ::waitpid(pid_, nullptr, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, WNOHANG);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

std::string tail_of(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  const std::string all = s.str();
  return all.size() > 3000 ? all.substr(all.size() - 3000) : all;
}

}  // namespace

TEST_CASE("the dashboard of 200 virtual devices renders in under a second, bounded: paged, grouped per edge") {
  const std::string browser = require_chromium();
  const fs::path work = fs::temp_directory_path() / ("cleave-dashboard-fleet-" + std::to_string(::getpid()));
  fs::remove_all(work);
  fs::create_directories(work);
  const std::uint16_t port = cleave::transport::free_loopback_port();
  constexpr int devices = 200, local_steps = 6;
  demo_process demo({"demo", "--no-emulation", "--virtual", "--devices", std::to_string(devices), "--edges", "4",
                     "--rounds", "1000", "--local-steps", std::to_string(local_steps), "--work",
                     (work / "run").string(), "--dashboard", "127.0.0.1:" + std::to_string(port)},
                    work / "demo.out");

  // Until two rounds closed.
  httplib::Client http("127.0.0.1", port);
  nlohmann::json state;
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    REQUIRE_MESSAGE(demo.running(), tail_of(work / "demo.out"));
    auto res = http.Get("/api/state");
    if (!res || res->status != 200) continue;
    state = nlohmann::json::parse(res->body);
    if (state["round"].get<int>() >= 2) break;
  }
  INFO(tail_of(work / "demo.out"));
  REQUIRE(state["round"].get<int>() >= 2);

  // The state: every device with its state and its progress in the round; the re-splits and the
  // rounds with their time.
  REQUIRE(state["devices"].size() == devices);
  CHECK(state["local_steps"] == local_steps);
  const std::set<std::string> states{"training", "done", "waiting", "offline"};
  for (const auto& d : state["devices"]) {
    CHECK(states.count(d["state"].get<std::string>()) == 1);
    CHECK(d["steps"].get<int>() <= local_steps);
    CHECK(d["step_seconds"].get<double>() >= 0);
  }
  for (const auto& h : state["history"]) {
    CHECK(h["at"].get<double>() >= state["started_at"].get<double>());
    CHECK(h["samples_per_second"].get<double>() > 0);
  }
  const std::size_t cuts = state["cuts"].size();
  CHECK(state["cuts_total"].get<std::size_t>() >= cuts);
  for (const auto& c : state["cuts"]) {
    CHECK(c["from"] != c["to"]);
    CHECK(c["at"].get<double>() >= state["started_at"].get<double>());
    CHECK(!c["why"].get<std::string>().empty());
  }

  // The page as the browser drew it.
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/";
  const std::string dom = chromium(browser, work / "browser", "--dump-dom", url);
  std::smatch m;
  REQUIRE_MESSAGE(
      std::regex_search(dom, m,
                        std::regex(R"re(<body data-round="(\d+)" data-phase="[a-z ]+" data-render-ms="([0-9.]+)" )re"
                                   R"re(data-elements="(\d+)")re")),
      dom.substr(0, 2000));
  const double render_ms = std::stod(m[2]);
  const int elements = std::stoi(m[3]);
  MESSAGE("200 devices: drawn in " << render_ms << " ms, " << elements << " elements");
  CHECK(std::stoi(m[1]) >= 2);
  CHECK(render_ms < 1000);
  CHECK(elements < 2500);
  // The table: one page of 50 rows, its devices' progress within the round.
  CHECK(count(dom, "<tr class=\"device\"") == 50);
  CHECK(dom.find("id=\"page-info\">1\u201350 of 200</span>") != std::string::npos);
  static const std::regex steps(R"re(data-steps="(\d+)")re");
  int rows = 0;
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), steps); it != std::sregex_iterator(); ++it, ++rows)
    CHECK(std::stoi((*it)[1]) <= local_steps);
  CHECK(rows == 50);
  // The topology: a group of 50 per edge, no node per device.
  for (int e = 1; e <= 4; ++e)
    CHECK(dom.find("class=\"group\" data-via=\"edge-" + std::to_string(e) + "\" data-devices=\"50\"") !=
          std::string::npos);
  CHECK(dom.find(">device-1</text>") == std::string::npos);
  CHECK(dom.find(">edge-4</text>") != std::string::npos);
  // The summary: the devices by state add up.
  int summed = 0;
  for (const char* id : {"sum-training", "sum-done", "sum-waiting", "sum-offline"}) {
    REQUIRE(std::regex_search(dom, m, std::regex(std::string("id=\"") + id + R"re(">(\d+)<)re")));
    summed += std::stoi(m[1]);
  }
  CHECK(summed == devices);
  CHECK(dom.find("<canvas id=\"timeline\"") != std::string::npos);
  CHECK(count(dom, "<tr class=\"cut\"") == static_cast<int>(std::min<std::size_t>(8, cuts)));

  const fs::path shot = fs::path(CLEAVE_ARTIFACTS_DIR) / "dashboard-fleet.png";
  fs::create_directories(shot.parent_path());
  fs::remove(shot);
  chromium(browser, work / "browser", "--screenshot=" + shot.string(), url, "1400,2400");
  CHECK(fs::file_size(shot) > 20000);
  MESSAGE("screenshot: " << shot.string());

  demo.stop();
  fs::remove_all(work);
}
