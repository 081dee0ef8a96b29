// `cleave provision` with the real binary: the CA made once and reused, kits with the right
// files, modes and configuration, --add leaving existing nodes alone, project files with
// mistakes refused by line, and kits unpacked into clean directories training a round.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <fstream>

#include "cleave/transport/certs.h"
#include "nodes.h"

#include "../support/run_cleave.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

// A command's standard output.
std::string capture(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  ::pclose(p);
  return out;
}

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 0777;
}

struct scratch {
  fs::path dir;
  explicit scratch(const std::string& tag)
      : dir(fs::temp_directory_path() / ("cleave-prov-" + std::to_string(::getpid()) + "-" + tag)) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  fs::path file(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name) << text;
    return dir / name;
  }
};

bool has(const outcome& o, const std::string& text) {
  return o.output.find(text) != std::string::npos;
}

// Unpacks `kit` with the system's tar into a new directory `into`.
void unpack(const fs::path& kit, const fs::path& into) {
  fs::create_directories(into);
  REQUIRE(shell("tar -xzf " + kit.string() + " -C " + into.string()) == 0);
}

const std::string long_name(64, 'n');

std::string project_text(bool with_third) {
  std::string t = R"(# a field trial
[project]
name = "trial"
days = 200

[agent]
data = "fashion-mnist"
partition = "dirichlet:0.5"

[[node]]
name = "server"
role = "server"
listen = "0.0.0.0:7000"
address = "gpu-host:7000"
rounds = 5

[[node]]
name = "edge-1"
role = "edge"
id = 100
listen = "0.0.0.0:7100"
address = "10.1.2.3:7100"

[[node]]
name = "device-1"
role = "device"
upstream = "edge-1"
backend = "onednn"

[[node]]
name = "sensor"
role = "device"
id = 7
shard = "1/2"
partition = "iid"
)";
  if (with_third) t += "\n[[node]]\nname = \"" + long_name + "\"\nrole = \"device\"\nid = 9\n";
  return t;
}

}  // namespace

TEST_CASE(
    "provision makes the CA once and a kit per node with its files, modes and configuration, and --add keeps keys") {
  REQUIRE_MESSAGE(shell("tar --version > /dev/null 2>&1") == 0, "the tar command is needed");
  scratch s("kits");
  const auto project = s.file("project.toml", project_text(false));
  const auto first = run_cleave({"provision", project.string()});
  REQUIRE_MESSAGE(first.status == 0, first.output);
  CHECK_MESSAGE(has(first, "created a new CA 'trial CA' in " + (s.dir / "certs").string()), first.output);
  CHECK(has(first, "4 kits written"));
  const fs::path certs = s.dir / "certs", kits = s.dir / "kits";
  for (const char* n : {"server", "edge-1", "device-1", "sensor"}) {
    CAPTURE(n);
    CHECK(mode_of(kits / (std::string(n) + ".tar.gz")) == 0600);
  }
  CHECK_FALSE(fs::exists(kits / "device-1.tar.gz.tmp"));

  // The listing as tar shows it: every file, its mode, its owner.
  const std::string listing = capture("tar -tvzf " + (kits / "device-1.tar.gz").string());
  MESSAGE(listing);
  CHECK(listing.find("drwxr-xr-x cleave/cleave") != std::string::npos);
  for (const char* line : {"-rw-r--r-- cleave/cleave", "device-1/README.txt", "-rwxr-xr-x", "device-1/start.sh",
                           "device-1/agent.toml", "drwx------", "device-1/certs/", "device-1/certs/ca.crt",
                           "device-1/certs/device-1.crt", "-rw------- cleave/cleave", "device-1/certs/device-1.key"})
    CHECK_MESSAGE(listing.find(line) != std::string::npos, line);
  CHECK(listing.find("ca.key") == std::string::npos);

  // Unpacked: the modes hold, the files are the node's, the configuration names its upstream.
  unpack(kits / "device-1.tar.gz", s.dir / "on-device-1");
  const fs::path kit = s.dir / "on-device-1" / "device-1";
  CHECK(mode_of(kit / "certs" / "device-1.key") == 0600);
  CHECK(mode_of(kit / "certs") == 0700);
  CHECK(mode_of(kit / "start.sh") == 0755);
  CHECK(read_file(kit / "certs" / "device-1.key") == read_file(certs / "device-1.key"));
  CHECK_NOTHROW(transport::check_node_files(kit / "certs" / "ca.crt", kit / "certs" / "device-1.crt",
                                            kit / "certs" / "device-1.key"));
  const std::string agent = read_file(kit / "agent.toml");
  for (const char* line : {"[agent]\n", "certs = \"certs\"\n", "name = \"device-1\"\n", "id = 1\n",
                           "connect = \"10.1.2.3:7100\"\n", "upstream-name = \"edge-1\"\n",
                           "data = \"fashion-mnist\"\n", "partition = \"dirichlet:0.5\"\n", "backend = \"onednn\"\n"})
    CHECK_MESSAGE(agent.find(line) != std::string::npos, agent);
  CHECK(read_file(kit / "start.sh").find("exec \"${CLEAVE:-cleave}\" --config agent.toml agent \"$@\"") !=
        std::string::npos);
  const std::string readme = read_file(kit / "README.txt");
  CHECK(readme.find("It connects to 'edge-1' at 10.1.2.3:7100.") != std::string::npos);
  // The packaged template unit that runs a kit unpacked into /etc/cleave.
  CHECK_MESSAGE(readme.find("systemctl enable --now cleave-agent@device-1.service") != std::string::npos, readme);
  const auto cert = transport::read_certificate_info(kit / "certs" / "device-1.crt");
  CHECK(cert.node_id == 1u);
  CHECK(std::chrono::duration_cast<std::chrono::hours>(cert.not_after - cert.not_before).count() / 24 == 200);

  unpack(kits / "sensor.tar.gz", s.dir / "on-sensor");
  const std::string sensor = read_file(s.dir / "on-sensor" / "sensor" / "agent.toml");
  // A node's own option wins over its role's; the rest of the role's come along.
  CHECK(sensor.find("partition = \"iid\"\n") != std::string::npos);
  CHECK(sensor.find("dirichlet") == std::string::npos);
  CHECK(sensor.find("id = 7\n") != std::string::npos);
  CHECK(sensor.find("connect = \"gpu-host:7000\"\nupstream-name = \"server\"\n") != std::string::npos);
  CHECK(transport::read_certificate_info(s.dir / "on-sensor" / "sensor" / "certs" / "sensor.crt").node_id == 7u);
  unpack(kits / "edge-1.tar.gz", s.dir / "on-edge");
  const std::string edge = read_file(s.dir / "on-edge" / "edge-1" / "edge.toml");
  CHECK_MESSAGE(edge.find("[edge]\ncerts = \"certs\"\nname = \"edge-1\"\nid = 100\nlisten = \"0.0.0.0:7100\"\nserver = "
                          "\"gpu-host:7000\"\nserver-name = \"server\"\n") != std::string::npos,
                edge);
  unpack(kits / "server.tar.gz", s.dir / "on-server");
  CHECK(read_file(s.dir / "on-server" / "server" / "server.toml").find("rounds = 5\n") != std::string::npos);

  // Run again: the CA and every key stay; a new node comes with --add, alone.
  const std::string ca_key = read_file(certs / "ca.key"), ca_crt = read_file(certs / "ca.crt");
  const std::string key1 = read_file(certs / "device-1.key");
  const auto again = run_cleave({"provision", project.string()});
  REQUIRE_MESSAGE(again.status == 0, again.output);
  CHECK_MESSAGE(has(again, "using the existing CA 'trial CA' in " + certs.string()), again.output);
  CHECK(has(again, "not re-minted"));
  CHECK(has(again, "device-1: kit " + (kits / "device-1.tar.gz").string() + " (existing certificate"));
  CHECK(read_file(certs / "ca.key") == ca_key);
  CHECK(read_file(certs / "ca.crt") == ca_crt);
  CHECK(read_file(certs / "device-1.key") == key1);

  const std::string kit_sensor = read_file(kits / "sensor.tar.gz");
  s.file("project.toml", project_text(true));
  const auto added = run_cleave({"provision", project.string(), "--add", long_name});
  REQUIRE_MESSAGE(added.status == 0, added.output);
  CHECK(has(added, "1 kit written"));
  CHECK(has(added, "using the existing CA"));
  CHECK(read_file(certs / "ca.key") == ca_key);
  CHECK(read_file(certs / "device-1.key") == key1);
  CHECK(read_file(kits / "sensor.tar.gz") == kit_sensor);
  // Its kit's paths pass 100 bytes: ustar's prefix field holds them.
  unpack(kits / (long_name + ".tar.gz"), s.dir / "on-long");
  CHECK(mode_of(s.dir / "on-long" / long_name / "certs" / (long_name + ".key")) == 0600);
  const auto twice = run_cleave({"provision", project.string(), "--add", "sensor"});
  CHECK(twice.status == 1);
  CHECK_MESSAGE(has(twice, "--add sensor: node 'sensor' is provisioned already"), twice.output);
  const auto unknown = run_cleave({"provision", project.string(), "--add", "device-9"});
  CHECK(unknown.status == 1);
  CHECK_MESSAGE(has(unknown, "--add device-9: no node 'device-9' in " + project.string()), unknown.output);

  // A revoked node gets no kit; the others' kits carry the revocation list.
  REQUIRE(run_cleave({"certs", "revoke", "sensor", "--dir", certs.string()}).status == 0);
  const auto after_revoke = run_cleave({"provision", project.string()});
  REQUIRE_MESSAGE(after_revoke.status == 0, after_revoke.output);
  CHECK_MESSAGE(has(after_revoke, "sensor: its certificate (serial"), after_revoke.output);
  CHECK(has(after_revoke, "is revoked: no kit"));
  CHECK(capture("tar -tzf " + (kits / "server.tar.gz").string()).find("server/certs/ca.crl") != std::string::npos);
  // A renewed node gets one again.
  REQUIRE(run_cleave({"certs", "renew", "sensor", "--dir", certs.string()}).status == 0);
  const auto renewed = run_cleave({"provision", project.string()});
  CHECK_MESSAGE(has(renewed, "sensor: kit "), renewed.output);

  // Half a CA is never completed with a new one (that would orphan every certificate).
  fs::rename(certs / "ca.key", s.dir / "ca.key.away");
  const auto half = run_cleave({"provision", project.string()});
  CHECK(half.status == 1);
  CHECK_MESSAGE(has(half, "half a CA in " + certs.string()), half.output);
  CHECK_FALSE(fs::exists(certs / "ca.key"));
}

TEST_CASE(
    "project files with mistakes are refused naming the file, the line and what is wrong, and nothing is written") {
  scratch s("bad");
  const std::string server = "[[node]]\nname = \"server\"\nrole = \"server\"\nlisten = \"127.0.0.1:7000\"\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {server + "[[node]]\nname = \"device-1\"\nrole = \"devise\"\n", "line 5: node 'device-1': unknown role 'devise'"},
      {server + "bakend = \"onednn\"\n", "line 5: node 'server': 'bakend' is not an option of `cleave server`"},
      {server + "connect = \"x:1\"\n", "line 5: node 'server': 'connect' is not an option of `cleave server`"},
      {server + "[[node]]\nname = \"d\"\nrole = \"device\"\nconnect = \"x:1\"\nid = 2\n",
       "line 8: node 'd': 'connect' is written by cleave provision from the project"},
      {server + "[[node]]\nname = \"d\"\nrole = \"device\"\n", "line 5: node 'd': a device needs an id"},
      {server + "[[node]]\nname = \"device-2\"\nrole = \"device\"\n[[node]]\nname = \"s\"\nrole = \"device\"\nid = 2\n",
       "line 8: node 's': id 2 is also node 'device-2''s"},
      {"[[node]]\nname = \"server\"\nrole = \"server\"\n", "line 1: node 'server': give address = \"HOST:PORT\""},
      {server + "[[node]]\nname = \"device-1\"\nrole = \"device\"\nupstream = \"edge-9\"\n",
       "line 5: node 'device-1': upstream 'edge-9' is not a node of the project"},
      {server + "rounds = 5\nrounds = 6\n", "line 6: 'rounds' is set twice (first on line 5)"},
      {server + "rounds = five\n", "line 5: 'five' is not a string, a number, true or false"},
      {"[project]\nnmae = \"x\"\n" + server, "line 2: unknown key 'nmae' in [project]"},
      {"[project]\nname = \"x\\n[server]\\nrounds = 1\"\n" + server,
       "line 2: 'name' must not hold line breaks or other control characters"},
      {"[node]\nname = \"server\"\n", "line 1: [node]: write each node as [[node]]"},
      {"[agent]\ndata = \"fashion-mnist\"\n", "no [[node]] in the project"},
  };
  for (const auto& [text, says] : cases) {
    CAPTURE(text);
    const auto p = s.file("p.toml", text);
    const auto o = run_cleave({"provision", p.string()});
    CHECK(o.status == 1);
    CHECK_MESSAGE(has(o, p.string() + ": " + says), o.output);
    CHECK_FALSE(fs::exists(s.dir / "certs"));
    CHECK_FALSE(fs::exists(s.dir / "kits"));
  }
}

TEST_CASE("kits unpacked into clean directories are enough to train a round: server and device from their kits") {
  scratch s("e2e");
  const fs::path data = make_idx_data(s.dir / "data", 512, 128);
  // A free loopback port for the server's kit (taken and released; the kits need a fixed one).
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const int port = ntohs(a.sin_port);
  ::close(fd);
  const auto project =
      s.file("project.toml",
             "[project]\nname = \"e2e\"\ncerts = \"ca-dir\"\nkits = \"out\"\n\n[server]\nmodel = \"mlp\"\ndata = \"" +
                 data.string() +
                 "\"\nbackend = \"reference\"\nrounds = 1\nlocal-steps = 3\nbatch = 16\nmin-devices = 1\nno-adapt "
                 "= true\n\n[agent]\ndata = \"" +
                 data.string() +
                 "\"\nbackend = \"reference\"\npartition = \"all\"\n\n[[node]]\nname = \"server\"\nrole = "
                 "\"server\"\nlisten = \"127.0.0.1:" +
                 std::to_string(port) + "\"\n\n[[node]]\nname = \"device-1\"\nrole = \"device\"\n");
  const auto o = run_cleave({"provision", project.string()});
  REQUIRE_MESSAGE(o.status == 0, o.output);
  unpack(s.dir / "out" / "server.tar.gz", s.dir / "host-a");
  unpack(s.dir / "out" / "device-1.tar.gz", s.dir / "host-b");
  // Each started by its kit's script from elsewhere, with nothing but the kit.
  const auto start = [&](const fs::path& script, const fs::path& log) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::FILE* f = std::freopen(log.c_str(), "w", stderr);
      if (f) ::dup2(::fileno(f), STDOUT_FILENO);
      if (::chdir("/") != 0) ::_exit(126);
      ::setenv("CLEAVE", CLEAVE_BINARY, 1);
      ::execl("/bin/sh", "sh", script.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return pid;
  };
  const pid_t server = start(s.dir / "host-a" / "server" / "start.sh", s.dir / "server.log");
  const pid_t device = start(s.dir / "host-b" / "device-1" / "start.sh", s.dir / "device.log");
  int server_status = 0, device_status = 0;
  const bool server_done = exited_within(server, 120, server_status);
  const bool device_done = exited_within(device, 30, device_status);
  const std::string slog = read_file(s.dir / "server.log");
  CHECK_MESSAGE(server_done, slog);
  CHECK_MESSAGE(WIFEXITED(server_status), slog);
  CHECK_MESSAGE(WEXITSTATUS(server_status) == 0, slog);
  CHECK_MESSAGE(slog.find("round 1/1: 1/1 devices") != std::string::npos, slog);
  CHECK(slog.find("accepted device-1") != std::string::npos);
  CHECK(device_done);
  CHECK_MESSAGE(WEXITSTATUS(device_status) == 0, read_file(s.dir / "device.log"));
}

TEST_CASE("the docs' project file provisions, and its edge's kit configuration is accepted by cleave edge") {
  scratch s("readme");
  const std::string readme = read_file(fs::path(CLEAVE_SOURCE_DIR) / "docs" / "deploying.md");
  const auto from = readme.find("```toml\n# project.toml");
  REQUIRE(from != std::string::npos);
  const auto body = from + std::string("```toml\n").size();
  const auto project = s.file("project.toml", readme.substr(body, readme.find("```", body) - body));
  const auto o = run_cleave({"provision", project.string()});
  REQUIRE_MESSAGE(o.status == 0, o.output);
  CHECK(has(o, "3 kits written"));
  unpack(s.dir / "kits" / "edge-1.tar.gz", s.dir / "edge-host");
  // Every key of its configuration is one `cleave edge` takes: it gets as far as the backend.
  const std::string run = "cd " + (s.dir / "edge-host" / "edge-1").string() + " && " + CLEAVE_BINARY +
                          " --config edge.toml edge --backend no-such-backend 2>&1; echo status=$?";
  const std::string out = capture(run);
  CHECK_MESSAGE(out.find("status=1") != std::string::npos, out);
  CHECK_MESSAGE(out.find("no-such-backend") != std::string::npos, out);
  CHECK(out.find("config") == std::string::npos);
}
