// The command line refuses careless input clearly: configuration files with typos, unknown
// sections or broken syntax, non-finite numbers, checkpoints that are not files, certificate
// lifetimes out of range. Runs the real `cleave` binary.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../support/run_cleave.h"

namespace fs = std::filesystem;
using cleave::testing::outcome;
using cleave::testing::run_cleave;

namespace {

// A scratch directory removed at the end of the test.
struct scratch {
  fs::path dir = fs::temp_directory_path() / ("cleave-cli-" + std::to_string(::getpid()));
  scratch() { fs::create_directories(dir); }
  ~scratch() { fs::remove_all(dir); }
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  }
};

bool has(const outcome& o, const std::string& text) {
  return o.output.find(text) != std::string::npos;
}

}  // namespace

TEST_CASE("a configuration file with an unknown key, an unknown section or broken syntax is refused naming the line") {
  scratch s;
  struct bad_file {
    const char* text;
    const char* says;
  };
  for (const bad_file& b : {
           bad_file{"[server]\nrounds = 3\nrouns = 3\n", "line 3: unknown key 'rouns' in [server]"},
           bad_file{"# typo\n[sever]\nrounds = 3\n", "line 2: unknown section [sever]"},
           bad_file{"rouns = 3\n", "line 1: unknown key 'rouns' outside any [section]"},
           bad_file{"[server\nrounds = 3\n", "line 1: a section header without ']'"},
           bad_file{"[server]\nrounds = = 3\n", "line 2: '=' is not a string, a number, true or false"},
           bad_file{"[server]\nname = \"srv\n", "line 2: a string that does not close"},
           bad_file{"[server]\nmodel = lenet5\n", "line 2: 'lenet5' is not a string, a number, true or false"},
           bad_file{"[server]\nrounds 3\n", "line 2: expected KEY = VALUE or [SECTION], got 'rounds 3'"},
           bad_file{"[server]\nrounds = 3\nrounds = 4\n", "line 3: 'rounds' is set twice (first on line 2)"},
           bad_file{"[server]\nallowed = [\"a\", \n", "line 2: an array must close on its line"},
       }) {
    CAPTURE(b.text);
    const auto path = s.file("bad.toml", b.text);
    const auto o = run_cleave({"--config", path, "server", "--certs", (s.dir / "none").string()});
    CHECK(o.status == 2);
    CHECK_MESSAGE(has(o, "cleave: error: config '" + path + "': " + b.says), o.output);
  }
}

TEST_CASE("the docs' configuration file is accepted") {
  scratch s;
  const auto path = s.file("federation.toml",
                           "# federation.toml\n[server]\ncerts = \"certs\"  # here\nlisten = \"0.0.0.0:7000\"\n"
                           "model = 'resnet8'\nrounds = 20\nlocal-steps = 100\nmin-devices = 8\nu-shape = true\n"
                           "allow = [\"device-1\", \"device-2\"]\n\n[agent]\nslowdown = 1.5\n");
  const auto o = run_cleave({"--config", path, "server", "--certs", (s.dir / "none").string()});
  CHECK(o.status == 1);  // it gets as far as the certificates
  CHECK_MESSAGE(has(o, "CA certificate not found"), o.output);
}

TEST_CASE("non-finite numbers are refused for every floating-point option, from flags and from files") {
  scratch s;
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"server", "--momentum", "nan"},
           {"server", "--weight-decay", "inf"},
           {"server", "--join-timeout", "nan"},
           {"server", "--stop-at-accuracy", "nan"},
           {"server", "--repay-rounds", "inf"},
           {"train", "--momentum", "nan"},
           {"train", "--weight-decay", "nan"},
           {"agent", "--slowdown", "nan", "--id", "1"},
           {"agent", "--give-up-after", "nan", "--id", "1"},
           {"edge", "--give-up-after", "nan"},
       }) {
    CAPTURE(args[0] + " " + args[1] + " " + args[2]);
    auto all = args;
    if (args[0] != "train") all.insert(all.end(), {"--certs", (s.dir / "none").string()});
    const auto o = run_cleave(all);
    CHECK(o.status != 0);
    // NaN passes every range check: it is refused as not finite; an infinity may fail a range first.
    CHECK_MESSAGE(has(o, args[2] == "nan" ? args[1] + ": 'nan' is not a finite number" : args[1] + ": "), o.output);
  }
  // The demo's options that go to its server.
  for (const char* option : {"--deadline", "--stop-at-accuracy"}) {
    CAPTURE(option);
    const auto o = run_cleave({"demo", option, "nan"});
    CHECK(o.status != 0);
    CHECK_MESSAGE(has(o, std::string(option) + ": 'nan' is not a finite number"), o.output);
  }
  const auto path = s.file("nan.toml", "[server]\nmomentum = nan\n");
  const auto o = run_cleave({"--config", path, "server", "--certs", (s.dir / "none").string()});
  CHECK(o.status != 0);
  CHECK_MESSAGE(has(o, "--momentum: 'nan' is not a finite number"), o.output);
}

TEST_CASE("bad aggregation rules are refused naming the option, from flags and from files") {
  scratch s;
  struct bad_rule {
    const char* rule;
    const char* says;
  };
  for (const bad_rule& b : {
           bad_rule{"average", "unknown aggregation 'average' (known: mean, median, trimmed-mean:F, clip:C)"},
           bad_rule{"trimmed-mean:0.5", "trimmed-mean:F needs 0 <= F < 0.5, not 0.5"},
           bad_rule{"trimmed-mean:nan", "trimmed-mean:F needs 0 <= F < 0.5, not nan"},
           bad_rule{"clip:0", "clip:C needs a finite C > 0, not 0"},
           bad_rule{"clip:inf", "clip:C needs a finite C > 0, not inf"},
           bad_rule{"clip:x", "'x' in 'clip:x' is not a number"},
       }) {
    CAPTURE(b.rule);
    const std::string says = std::string("cleave: error: --aggregate '") + b.rule + "': " + b.says;
    for (const char* command : {"server", "demo"}) {
      std::vector<std::string> args{command, "--aggregate", b.rule};
      if (std::string(command) == "server") args.insert(args.end(), {"--certs", (s.dir / "none").string()});
      const auto o = run_cleave(args);
      CHECK(o.status == 1);
      CHECK_MESSAGE(has(o, says), o.output);
    }
    const auto path = s.file("rule.toml", std::string("[server]\naggregate = \"") + b.rule + "\"\n");
    const auto o = run_cleave({"--config", path, "server", "--certs", (s.dir / "none").string()});
    CHECK(o.status == 1);
    CHECK_MESSAGE(has(o, says), o.output);
  }
}

TEST_CASE("a checkpoint that is a directory or a device is refused with a message, not an abort") {
  for (const std::string path : {"/tmp", "/dev/zero"}) {
    for (const std::string option : {"eval --checkpoint", "train --resume"}) {
      CAPTURE(option);
      const auto o = run_cleave(
          {option.substr(0, option.find(' ')), option.substr(option.find(' ') + 1), path, "--data", "/nonexistent"});
      CHECK(o.status == 1);
      CHECK_MESSAGE(has(o, "cleave: error: checkpoint '" + path + "': not a regular file"), o.output);
    }
  }
}

TEST_CASE("a server checkpoint path in a missing directory is refused before anything starts") {
  scratch s;
  const std::string path = (s.dir / "missing" / "global.ckpt").string();
  const auto o = run_cleave({"server", "--certs", s.dir.string(), "--checkpoint", path});
  CHECK(o.status == 1);
  CHECK_MESSAGE(has(o, "cleave: error: --checkpoint '" + path + "': directory '" + (s.dir / "missing").string() +
                           "' does not exist"),
                o.output);
}

TEST_CASE("integer options out of their range are refused naming the option") {
  scratch s;
  const std::string certs = (s.dir / "none").string();
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"server", "--certs", certs, "--rounds", "0"}, "--rounds: Value 0 not in range 1 to 1000000"},
           {{"server", "--certs", certs, "--batch", "100000"}, "--batch: Value 100000 not in range 1 to 65536"},
           {{"edge", "--certs", certs, "--id", "0"}, "--id: Value 0 not in range 1 to 999999"},
           {{"agent", "--certs", certs, "--id", "1000000"}, "--id: Value 1000000 not in range 1 to 999999"},
           {{"demo", "--local-steps", "0"}, "--local-steps: Value 0 not in range 1 to 1000000"},
           {{"server", "--certs", certs, "--rounds", "3.5"}, "--rounds"},
       }) {
    CAPTURE(args[args.size() - 2] + " " + args.back());
    const auto o = run_cleave(args);
    CHECK(o.status != 0);
    CHECK(o.status != 1);  // refused while parsing, before anything runs
    CHECK_MESSAGE(has(o, says), o.output);
  }
}

TEST_CASE("certificate lifetimes outside 1 to 36500 days are refused") {
  scratch s;
  const auto certs = (s.dir / "certs").string();
  REQUIRE(run_cleave({"certs", "init", "--dir", certs}).status == 0);
  for (const std::string days : {"100000000", "36501", "0"}) {
    const auto o = run_cleave({"certs", "issue", "device-1", "--role", "device", "--dir", certs, "--days", days});
    CHECK(o.status != 0);
    CHECK_MESSAGE(has(o, "--days"), o.output);
    CHECK_FALSE(fs::exists(s.dir / "certs" / "device-1.crt"));
  }
  CHECK(run_cleave({"certs", "issue", "device-1", "--role", "device", "--dir", certs, "--days", "36500"}).status == 0);
}

TEST_CASE("a private key other users can read is used with a warning that says how to fix it") {
  scratch s;
  const auto certs = (s.dir / "certs").string();
  REQUIRE(run_cleave({"certs", "init", "--dir", certs}).status == 0);
  REQUIRE(run_cleave({"certs", "issue", "server", "--role", "server", "--dir", certs}).status == 0);
  const auto quiet = run_cleave({"server", "--certs", certs, "--data", (s.dir / "no-data").string()});
  CHECK_FALSE(has(quiet, "can be read by other users"));
  fs::permissions(s.dir / "certs" / "server.key", fs::perms::group_read | fs::perms::others_read,
                  fs::perm_options::add);
  const auto o = run_cleave({"server", "--certs", certs, "--data", (s.dir / "no-data").string()});
  CHECK(o.status == 1);  // it went on to the data, which is missing
  CHECK_MESSAGE(has(o, "server.key can be read by other users (mode 644); make it private: chmod 600"), o.output);
}

TEST_CASE("a device certificate binds an id: given with --id or read from a name ending in -N") {
  scratch s;
  const auto certs = (s.dir / "certs").string();
  REQUIRE(run_cleave({"certs", "init", "--dir", certs}).status == 0);
  const auto none = run_cleave({"certs", "issue", "sensor", "--role", "device", "--dir", certs});
  CHECK(none.status == 1);
  CHECK_MESSAGE(has(none, "device 'sensor' needs an id: give --id N, or a name ending in -N (device-3)"), none.output);
  const auto given = run_cleave({"certs", "issue", "sensor", "--role", "device", "--id", "9", "--dir", certs});
  CHECK(given.status == 0);
  CHECK_MESSAGE(has(given, "device 'sensor' (id 9) valid for 365 days"), given.output);
  const auto named = run_cleave({"certs", "issue", "device-4", "--role", "device", "--dir", certs});
  CHECK_MESSAGE(has(named, "device 'device-4' (id 4)"), named.output);
}

TEST_CASE("certs renew and revoke name what is wrong: no node, an unknown node or reason, a bad lifetime") {
  scratch s;
  const auto certs = (s.dir / "certs").string();
  REQUIRE(run_cleave({"certs", "init", "--dir", certs}).status == 0);
  REQUIRE(run_cleave({"certs", "issue", "device-1", "--role", "device", "--dir", certs, "--days", "40"}).status == 0);
  const auto none = run_cleave({"certs", "revoke", "--dir", certs});
  CHECK(none.status == 1);
  CHECK_MESSAGE(has(none, "give a node NAME or --cert FILE"), none.output);
  const auto nobody = run_cleave({"certs", "revoke", "nobody", "--dir", certs});
  CHECK(nobody.status == 1);
  CHECK_MESSAGE(has(nobody, "certificate not found: " + certs + "/nobody.crt"), nobody.output);
  const auto reason = run_cleave({"certs", "revoke", "device-1", "--reason", "lost", "--dir", certs});
  CHECK(reason.status != 0);
  CHECK_MESSAGE(has(reason, "--reason"), reason.output);
  CHECK_FALSE(fs::exists(s.dir / "certs" / "ca.crl"));
  const auto renew_nobody = run_cleave({"certs", "renew", "nobody", "--dir", certs});
  CHECK(renew_nobody.status == 1);
  CHECK_MESSAGE(has(renew_nobody, "no certificate of 'nobody' in " + certs), renew_nobody.output);
  const auto days = run_cleave({"certs", "renew", "device-1", "--days", "0", "--dir", certs});
  CHECK(days.status != 0);
  CHECK_MESSAGE(has(days, "--days"), days.output);
  const auto renewed = run_cleave({"certs", "renew", "device-1", "--dir", certs});
  CHECK(renewed.status == 0);
  CHECK_MESSAGE(has(renewed, "renewed device 'device-1' (id 1): new key, serial "), renewed.output);
  CHECK_MESSAGE(has(renewed, "valid for 40 days"), renewed.output);
  CHECK(has(renewed, ") stays valid until it expires; revoke it with --revoke-old"));
  const auto revoked = run_cleave({"certs", "revoke", "device-1", "--dir", certs});
  CHECK(revoked.status == 0);
  CHECK_MESSAGE(has(revoked, "revocation list " + certs + "/ca.crl (1 revoked)"), revoked.output);
  CHECK(has(run_cleave({"certs", "revoke", "device-1", "--dir", certs}), "was already revoked"));
}

TEST_CASE("bad cut codecs and cut defences are refused naming the option") {
  scratch s;
  const std::string certs = (s.dir / "none").string();
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"server", "--certs", certs, "--codecs", "f32,f8"},
            "--codecs: codec list 'f32,f8': unknown codec 'f8' (known: f32, f16, bf16, int8, topk)"},
           {{"server", "--certs", certs, "--codecs", "f16:0.5"},
            "--codecs: codec list 'f16:0.5': 'f16:0.5': only topk takes a fraction"},
           {{"demo", "--codecs", "int9"}, "unknown codec 'int9'"},
           {{"agent", "--certs", certs, "--id", "1", "--activation-noise", "1"},
            "--activation-noise 1 needs --activation-clip: the noise is scaled to the clipping bound"},
           {{"agent", "--certs", certs, "--gradient-check", "loud"}, "--gradient-check: loud not in {off,warn,refuse}"},
           {{"agent", "--certs", certs, "--activation-clip", "-1"}, "--activation-clip: Value -1 not in range"},
       }) {
    CAPTURE(args[args.size() - 2] + " " + args.back());
    const auto o = run_cleave(args);
    CHECK(o.status != 0);
    CHECK_MESSAGE(has(o, says), o.output);
  }
}
