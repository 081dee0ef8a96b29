// `cleave-fashion-mnist`: Fashion-MNIST image classification across devices. One process holds
// the whole federation: a server, an edge and N device agents over loopback TLS; each device
// keeps its own shard (IID or non-IID) and trains the bottom blocks, the edge the middle ones,
// the server the top and the loss; every round their copies are averaged.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "../common/sample_app.h"
#include "cleave/core/dataset.h"
#include "cleave/federation/local_federation.h"

namespace fs = std::filesystem;
using namespace cleave;

namespace {

struct options {
  std::string data = "fashion-mnist";
  std::string model = "lenet5";
  int devices = 3;
  std::string partition = "iid";
  std::int64_t eval_samples = 0;
  apps::run_options run;
};

int run(const options& o) {
  const apps::work_dir wd(o.run.work, "cleave-fmnist-");
  federation::local_config fc = apps::local_federation(o.run, wd.path(), o.devices);
  server::server_config& sc = fc.server;
  sc.data = o.data;  // the server evaluates on the test split
  sc.model = o.model;
  sc.eval_samples = o.eval_samples;
  // The training split loaded once and shared: each agent picks its shard from its labels.
  core::load_options lo;
  lo.test = false;
  const auto train = std::make_shared<core::dataset>(std::move(core::load_dataset(o.data, lo).train));
  std::printf("%s: %lld training images %s, %d classes; %d devices, %s shards\n", train->name.c_str(),
              static_cast<long long>(train->size()), train->item.str().c_str(), train->n_classes, o.devices,
              o.partition.c_str());
  for (int d = 0; d < o.devices; ++d) {
    device::agent_config a;
    a.id = static_cast<std::uint32_t>(d + 1);
    a.source = train;
    a.n_shards = o.devices;
    a.shard = d;
    a.partition = cleave::core::parse_partition(o.partition);
    a.partition_seed = o.run.seed;
    a.backend = o.run.backend;
    fc.devices.push_back(std::move(a));
  }
  return apps::run_and_report(std::move(fc), o.run.min_accuracy, "test images");
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app("Fashion-MNIST split-trained by a server, an edge and several devices in one process");
  app.add_option("--data", o.data, "fashion-mnist, or an IDX directory")->capture_default_str();
  app.add_option("--model", o.model, "a zoo model or a .json spec")->capture_default_str();
  app.add_option("--devices", o.devices)->capture_default_str();
  app.add_option("--partition", o.partition, "iid, dirichlet:ALPHA or classes:K")->capture_default_str();
  app.add_option("--eval-samples", o.eval_samples, "test images per evaluation (0: all)")->capture_default_str();
  apps::add_run_options(app, o.run);
  CLI11_PARSE(app, argc, argv);
  return apps::run_guarded(o.run.log_level, [&] { return run(o); });
}
