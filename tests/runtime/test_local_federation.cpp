// The in-process federation (federation::run_local) as an app uses it: devices whose ids are
// left unset are numbered, two devices with one id are refused at start (they would evict each
// other's connection forever), and an agent built without an id says so.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "../support/error_of.h"
#include "cleave/core/model_builder.h"
#include "cleave/federation/local_federation.h"

using namespace cleave;
namespace fs = std::filesystem;

namespace {

// Two classes of sine waves, 1 channel of 32 readings: small enough to train in a blink.
class waves final : public core::data_source {
 public:
  std::int64_t size() const override { return 64; }
  core::shape sample_shape() const override { return {1, 1, 32}; }
  int class_count() const override { return 2; }
  std::vector<std::int32_t> labels() const override {
    std::vector<std::int32_t> y(64);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>(i % 2);
    return y;
  }
  void fetch(const std::int64_t* idx, std::int64_t n, float* x, std::int32_t* y) const override {
    for (std::int64_t i = 0; i < n; ++i) {
      const double f = idx[i] % 2 ? 0.4 : 0.1;
      for (int t = 0; t < 32; ++t)
        x[i * 32 + t] = static_cast<float>(std::sin(f * t + 0.1 * static_cast<double>(idx[i])));
      y[i] = static_cast<std::int32_t>(idx[i] % 2);
    }
  }
};

struct small_federation {
  fs::path dir = fs::temp_directory_path() / ("cleave-local-" + std::to_string(::getpid()));
  federation::local_config fc;
  small_federation(int n_devices) {
    fs::remove_all(dir);
    federation::provision_local(dir / "certs", n_devices);
    core::model_builder b("waves", {1, 1, 32}, 2);
    b.conv2d(4, {1, 5}).relu().global_avg_pool().linear(2);
    const auto data = std::make_shared<waves>();
    fc.certs = dir / "certs";
    fc.use_edge = false;
    fc.server.model_spec = b.build();
    fc.server.test_source = data;
    fc.server.backend = "reference";
    fc.server.rounds = 1;
    fc.server.local_steps = 4;
    fc.server.batch = 8;
    fc.server.min_devices = n_devices;
    fc.server.adaptive = false;
    for (int i = 0; i < n_devices; ++i) {
      device::agent_config a;  // no id: as an app that leaves it unset
      a.source = data;
      a.backend = "reference";
      fc.devices.push_back(a);
    }
  }
  ~small_federation() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

TEST_CASE("devices left without an id in a local federation are numbered and train") {
  small_federation f(2);
  const auto got = federation::run_local(f.fc);
  REQUIRE(got.rounds.size() == 1);
  CHECK(got.rounds[0].n_devices == 2);
  REQUIRE(got.rounds[0].routes.size() == 2);
  CHECK(got.rounds[0].routes[0].first == 1);
  CHECK(got.rounds[0].routes[1].first == 2);
}

TEST_CASE("two devices with one id are refused at the start of a local federation, naming them") {
  small_federation f(3);
  f.fc.devices[2].id = 2;  // device 1 (by position) is numbered 2 as well
  CHECK(testing::error_of([&] { federation::run_local(f.fc); }) ==
        "local federation: devices 1 and 2 (by position) both have id 2; ids must be unique");
}

TEST_CASE("an agent built without an id says so") {
  device::agent_config a;
  CHECK(testing::error_of([&] { device::agent ag(a); }).find("device id not set") == 0);
}
