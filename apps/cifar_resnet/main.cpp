// `cleave-cifar-resnet`: a ResNet on CIFAR-10/100 (the binary format) split three ways: the
// device agents run its stem, the edge the middle residual blocks, the server the rest and the
// loss. Devices augment their own batches (crop and flip) and keep their shards; one process
// holds the whole federation over loopback TLS.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "../common/sample_app.h"
#include "cleave/core/dataset.h"
#include "cleave/core/model.h"
#include "cleave/federation/local_federation.h"

namespace fs = std::filesystem;
using namespace cleave;

namespace {

struct options {
  std::string data;
  std::string model;  // default: resnet18 where the zoo has it, else resnet8
  std::string augment = "crop,flip";
  std::string cuts;  // "" = the planner's default cuts for a device behind an edge
  int devices = 3;
  std::string partition = "iid";
  int rounds = 3;
  int local_steps = 50;
  int batch = 32;
  float lr = 0.05f;
  std::int64_t eval_samples = 0;
  std::uint64_t seed = 1;
  std::string backend = "auto";
  bool no_edge = false;
  std::string work;
  double min_accuracy = 0;
  std::string log_level = "warn";
};

// The deepest ResNet the zoo has of the two this app knows.
std::string default_model() {
  for (const auto& n : core::zoo_names())
    if (n == "resnet18") return n;
  return "resnet8";
}

int run(options o) {
  if (o.model.empty()) o.model = default_model();
  const apps::work_dir wd(o.work, "cleave-cifar-");
  const fs::path& work = wd.path();
  federation::provision_local(work / "certs", o.devices);
  federation::local_config fc;
  fc.certs = work / "certs";
  fc.use_edge = !o.no_edge;
  server::server_config& sc = fc.server;
  sc.data = o.data;  // the server evaluates on the test split
  sc.model = o.model;
  if (!o.cuts.empty()) sc.edge_cuts = split::parse_cuts(o.cuts);
  sc.rounds = o.rounds;
  sc.local_steps = o.local_steps;
  sc.batch = o.batch;
  sc.min_devices = o.devices;
  sc.eval_samples = o.eval_samples;
  sc.seed = o.seed;
  sc.backend = o.backend;
  sc.opt.lr = o.lr;
  sc.on_round = apps::print_round;
  // The training split loaded once and shared: each agent picks its shard from its labels.
  core::load_options lo;
  lo.test = false;
  const auto train = std::make_shared<core::dataset>(std::move(core::load_dataset(o.data, lo).train));
  std::printf("%s: %lld training images %s, %d classes; %s; %d devices, %s shards, cuts %s\n", train->name.c_str(),
              static_cast<long long>(train->size()), train->item.str().c_str(), train->n_classes, o.model.c_str(),
              o.devices, o.partition.c_str(), o.cuts.empty() ? "default" : o.cuts.c_str());
  for (int d = 0; d < o.devices; ++d) {
    device::agent_config a;
    a.id = static_cast<std::uint32_t>(d + 1);
    a.source = train;
    a.n_shards = o.devices;
    a.shard = d;
    a.partition = cleave::core::parse_partition(o.partition);
    a.partition_seed = o.seed;
    a.backend = o.backend;
    a.augment = core::parse_augment(o.augment);
    fc.devices.push_back(std::move(a));
  }
  const auto result = federation::run_local(std::move(fc));
  const server::round_report* lr = apps::last_round(result);
  if (!lr) return 1;
  const server::round_report& last = *lr;
  std::printf("final test accuracy %.4f over %lld test images\n", last.test_accuracy,
              static_cast<long long>(last.test_samples));
  return apps::check_accuracy(last.test_accuracy, o.min_accuracy);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app("A ResNet on CIFAR split across devices, an edge and a server in one process");
  app.add_option("--data", o.data, "a CIFAR-10 or CIFAR-100 binary directory")->required();
  app.add_option("--model", o.model,
                 "a zoo model or a .json spec (default: resnet18 where the zoo has it, else resnet8)");
  app.add_option("--cuts", o.cuts, "block cuts device|edge|server, e.g. 3,5 (default: the planner's)");
  app.add_option("--augment", o.augment, "the devices' augmentation (none, crop, flip, crop:PAD ...)")
      ->capture_default_str();
  app.add_option("--devices", o.devices)->capture_default_str();
  app.add_option("--partition", o.partition, "iid, dirichlet:ALPHA or classes:K")->capture_default_str();
  app.add_option("--rounds", o.rounds)->capture_default_str();
  app.add_option("--local-steps", o.local_steps, "steps per device per round")->capture_default_str();
  app.add_option("--batch", o.batch)->capture_default_str();
  app.add_option("--lr", o.lr)->capture_default_str();
  app.add_option("--eval-samples", o.eval_samples, "test images per evaluation (0: all)")->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--backend", o.backend)->capture_default_str();
  app.add_flag("--no-edge", o.no_edge, "devices connect straight to the server");
  app.add_option("--work", o.work, "directory for the certificates (default: a temporary one, removed)");
  app.add_option("--min-accuracy", o.min_accuracy, "exit 1 when the final test accuracy is below this");
  app.add_option("--log-level", o.log_level)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return apps::run_guarded(o.log_level, [&] { return run(o); });
}
