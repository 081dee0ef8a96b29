// `cleave-activity`: human activity recognition learned across wearables. Each device agent is
// one simulated user whose accelerometer windows never leave it; a 1-D convolutional network
// (conv2d over (3,1,T) with (1,k) kernels) is split between the devices, an edge and a server,
// and the server evaluates the global model on users it has never seen.
#include <spdlog/spdlog.h>

#include <unistd.h>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "../common/sample_app.h"
#include "accelerometer.h"
#include "cleave/core/error.h"
#include "cleave/core/model_builder.h"
#include "cleave/federation/local_federation.h"

namespace fs = std::filesystem;
using namespace cleave;

namespace {

struct options {
  int users = 4;
  std::int64_t windows = 400;  // per training user
  int window_len = 128;        // readings per window: 2.56 s at 50 Hz
  int test_users = 4;
  std::int64_t test_windows = 100;
  double mix_alpha = 0.5;
  apps::run_options run{.rounds = 5, .local_steps = 20, .lr = 0.02f};
};

// conv -> pool twice, a third conv, a global average over time, and the classifier.
core::model_spec har_model(int window_len) {
  core::model_builder b("har-cnn", {3, 1, window_len}, activity::n_activities);
  b.conv2d(16, {1, 7}).batchnorm2d().relu().maxpool2d({1, 2});
  b.conv2d(32, {1, 5}).batchnorm2d().relu().maxpool2d({1, 2});
  b.conv2d(32, {1, 3}).relu().global_avg_pool().linear(activity::n_activities);
  return b.build();
}

int run(const options& o) {
  const apps::work_dir wd(o.run.work, "cleave-activity-");
  federation::local_config fc = apps::local_federation(o.run, wd.path(), o.users);
  server::server_config& sc = fc.server;
  sc.model_spec = har_model(o.window_len);
  // The test population: other users, every activity equally often.
  std::vector<activity::user_profile> held_out;
  for (int i = 0; i < o.test_users; ++i)
    held_out.push_back(activity::make_user(static_cast<std::uint32_t>(10000 + i), o.run.seed, o.mix_alpha, true));
  sc.test_source = std::make_shared<activity::accelerometer_source>(held_out, o.test_windows, o.window_len, o.run.seed);
  sc.adaptive = false;
  sc.on_round = [](const server::round_report& r) {
    std::printf("round %llu: train loss %.4f acc %.4f, test loss %.4f acc %.4f\n",
                static_cast<unsigned long long>(r.round), r.train_loss, r.train_accuracy, r.test_loss, r.test_accuracy);
    std::fflush(stdout);
  };
  for (int u = 1; u <= o.users; ++u) {
    // Device u is user u: its own gait, orientation and activity mix; it keeps all its windows.
    const auto user = activity::make_user(static_cast<std::uint32_t>(u), o.run.seed, o.mix_alpha);
    device::agent_config a;
    a.id = static_cast<std::uint32_t>(u);
    a.backend = o.run.backend;
    a.source = std::make_shared<activity::accelerometer_source>(std::vector{user}, o.windows, o.window_len, o.run.seed);
    a.partition = cleave::core::parse_partition("all");
    std::string mix;
    for (int k = 0; k < activity::n_activities; ++k)
      mix += fmt::format("{}{} {:.0f}%", k ? ", " : "", activity::name_of(static_cast<activity::kind>(k)),
                         100 * user.mix[static_cast<std::size_t>(k)]);
    std::printf("user %d: gait x%.2f, amplitude x%.2f; %s\n", u, user.freq_scale, user.amp_scale, mix.c_str());
    fc.devices.push_back(std::move(a));
  }
  const std::string over = "windows of " + std::to_string(o.test_users) + " held-out users (chance " +
                           fmt::format("{:.4f}", 1.0 / activity::n_activities) + ")";
  return apps::run_and_report(std::move(fc), o.run.min_accuracy, over);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app("Activity recognition from simulated accelerometers, one user per device, split-trained");
  app.add_option("--users", o.users, "devices, one simulated user each")->capture_default_str();
  app.add_option("--windows", o.windows, "windows per user")->capture_default_str();
  app.add_option("--window-len", o.window_len, "readings per window (50 Hz)")->capture_default_str();
  app.add_option("--test-users", o.test_users, "held-out users the server evaluates on")->capture_default_str();
  app.add_option("--test-windows", o.test_windows, "windows per held-out user")->capture_default_str();
  app.add_option("--mix-alpha", o.mix_alpha, "Dirichlet concentration of each user's activity mix")
      ->capture_default_str();
  apps::add_run_options(app, o.run);
  CLI11_PARSE(app, argc, argv);
  return apps::run_guarded(o.run.log_level, [&] { return run(o); });
}
