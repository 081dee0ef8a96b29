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
  std::int64_t eval_samples = 0;
  apps::run_options run;
};

// The deepest ResNet the zoo has of the two this app knows.
std::string default_model() {
  for (const auto& n : core::zoo_names())
    if (n == "resnet18") return n;
  return "resnet8";
}

int run(options o) {
  if (o.model.empty()) o.model = default_model();
  const apps::work_dir wd(o.run.work, "cleave-cifar-");
  federation::local_config fc = apps::local_federation(o.run, wd.path(), o.devices);
  server::server_config& sc = fc.server;
  sc.data = o.data;  // the server evaluates on the test split
  sc.model = o.model;
  if (!o.cuts.empty()) sc.edge_cuts = split::parse_cuts(o.cuts);
  sc.eval_samples = o.eval_samples;
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
    a.partition_seed = o.run.seed;
    a.backend = o.run.backend;
    a.augment = core::parse_augment(o.augment);
    fc.devices.push_back(std::move(a));
  }
  return apps::run_and_report(std::move(fc), o.run.min_accuracy, "test images");
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
  app.add_option("--eval-samples", o.eval_samples, "test images per evaluation (0: all)")->capture_default_str();
  apps::add_run_options(app, o.run);
  CLI11_PARSE(app, argc, argv);
  return apps::run_guarded(o.run.log_level, [&] { return run(o); });
}
