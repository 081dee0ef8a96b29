// Trains one zoo model on one backend for a warm-up and then N timed steps (or whole epochs)
// and prints one JSON line: images/s of the timed loop, whole-process wall time, peak RSS and,
// with --epochs, the test accuracy. A model this build's zoo does not know is reported as
// skipped (exit 0), so run.sh can list every model of the comparison. Used by run.sh.
// Usage: bench_models --model M [--backend onednn:2] [--data D] [--batch 64] [--steps 20]
//                     [--warmup 3] [--epochs 0] [--lr 0.05] [--momentum 0.9] [--seed 1]
//                     [--lr-schedule constant|cosine]   (cosine: over every step of the epochs)
//                     [--init-out F] [--final-out F] [--order-out F] [--max-steps N]
// With --epochs, --init-out and --final-out write the model before and after training as
// safetensors under PyTorch's state_dict names (as `cleave export`), and --order-out the sample
// order of every epoch (i64 little-endian, epochs x n): compare.py starts PyTorch from the same
// weights in the same order, and evaluates cleave's trained weights in PyTorch. --max-steps cuts
// each epoch after N steps (the schedule then spans those steps), to compare a few steps.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "cleave/backend/registry.h"
#include "cleave/core/checkpoint.h"
#include "cleave/core/error.h"
#include "cleave/core/random.h"
#include "cleave/core/torch_export.h"
#include "cleave/core/trainer.h"

namespace {

const auto t_start = std::chrono::steady_clock::now();

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double peak_rss_mib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// The trainer's model as safetensors under PyTorch's names.
void save_torch(const std::string& path, cleave::core::trainer& t, const cleave::core::model_spec& m,
                std::uint64_t seed, std::int64_t epoch) {
  using namespace cleave;
  const auto ck = core::capture(t.model_stage(), t.opt(), seed, epoch);
  const auto state = core::torch_state_dict(ck, m, path);
  core::save_safetensors(path, state.tensors, state.metadata);
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "onednn:2", model = "lenet5", data = "fashion-mnist", schedule = "constant";
  std::string init_out, final_out, order_out;
  int batch = 64, steps = 20, warmup = 3, epochs = 0, max_steps = -1;
  float lr = 0.05f, momentum = 0.9f;
  long long seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--backend")
      backend = v;
    else if (k == "--model")
      model = v;
    else if (k == "--data")
      data = v;
    else if (k == "--batch")
      batch = std::stoi(v);
    else if (k == "--steps")
      steps = std::stoi(v);
    else if (k == "--warmup")
      warmup = std::stoi(v);
    else if (k == "--epochs")
      epochs = std::stoi(v);
    else if (k == "--lr")
      lr = std::stof(v);
    else if (k == "--momentum")
      momentum = std::stof(v);
    else if (k == "--seed")
      seed = std::stoll(v);
    else if (k == "--lr-schedule")
      schedule = v;
    else if (k == "--init-out")
      init_out = v;
    else if (k == "--final-out")
      final_out = v;
    else if (k == "--order-out")
      order_out = v;
    else if (k == "--max-steps")
      max_steps = std::stoi(v);
    else {
      std::fprintf(stderr, "bench_models: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  using namespace cleave;
  const auto names = core::zoo_names();
  if (std::find(names.begin(), names.end(), model) == names.end()) {
    std::printf("{\"framework\": \"cleave\", \"model\": \"%s\", \"skipped\": \"not in this build's zoo\"}\n",
                model.c_str());
    return 0;
  }
  try {
    if (epochs <= 0 && !(init_out.empty() && final_out.empty() && order_out.empty()))
      throw core::error("--init-out, --final-out and --order-out need --epochs");
    core::load_options lo;
    lo.test = epochs > 0;  // the timed loop never evaluates
    const auto d = core::load_dataset(data, lo);
    const auto m = core::zoo_model(model, d.train.item, d.train.n_classes);
    auto b = backend::make_backend(backend);
    core::train_config c;
    c.batch = batch;
    c.epochs = std::max(1, epochs);
    c.seed = static_cast<std::uint64_t>(seed);
    c.opt.lr = lr;
    c.opt.momentum = momentum;
    c.opt.schedule = core::parse_schedule_kind(schedule);
    c.max_steps = max_steps;
    core::fit_schedule(c, epochs > 0 ? d.train.size() : static_cast<std::int64_t>(warmup + steps) * batch);
    core::trainer t(*b, m, c);
    std::int64_t images = 0;
    double secs = 0;
    double accuracy = -1;
    if (!init_out.empty()) save_torch(init_out, t, m, c.seed, 0);
    if (!order_out.empty()) {
      std::ofstream f(order_out, std::ios::binary | std::ios::trunc);
      for (int e = 0; e < epochs && f; ++e) {
        const auto order = core::epoch_order(d.train.size(), c.seed, e);
        f.write(reinterpret_cast<const char*>(order.data()),
                static_cast<std::streamsize>(order.size() * sizeof(std::int64_t)));
      }
      if (!f.flush()) throw core::error("--order-out '" + order_out + "': cannot write");
    }
    if (epochs > 0) {
      for (int e = 0; e < epochs; ++e) {
        const auto t0 = std::chrono::steady_clock::now();
        images += t.train_epoch(d.train, e, {});
        secs += seconds_since(t0);
      }
      accuracy = t.evaluate(d.test).accuracy;
      if (!final_out.empty()) save_torch(final_out, t, m, c.seed, epochs);
    } else {
      // Batches of a seeded permutation, drawn as the trainer draws them (u8 -> normalised f32).
      std::vector<std::int64_t> order(static_cast<std::size_t>(d.train.size()));
      std::iota(order.begin(), order.end(), 0);
      core::rng r(static_cast<std::uint64_t>(seed));
      for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[r.below(i)]);
      const std::int64_t n_batches = d.train.size() / batch;
      std::vector<float> x(static_cast<std::size_t>(batch * d.train.item.numel()));
      std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
      auto run = [&](int s) {
        d.train.gather(order.data() + (s % n_batches) * batch, batch, x.data(), y.data());
        return t.step(x.data(), y.data(), batch);
      };
      for (int s = 0; s < warmup; ++s) run(s);
      b->synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      core::tensor loss;
      for (int s = 0; s < steps; ++s) loss = run(warmup + s);
      float last = 0;
      b->download(loss, &last);
      b->synchronize();
      secs = seconds_since(t0);
      images = static_cast<std::int64_t>(steps) * batch;
    }
    std::printf(
        "{\"framework\": \"cleave\", \"backend\": \"%s\", \"model\": \"%s\", \"params\": %lld, \"batch\": %d, "
        "\"images\": %lld, \"train_seconds\": %.3f, \"images_per_s\": %.1f, \"test_accuracy\": %s, "
        "\"wall_s\": %.3f, \"peak_rss_mib\": %.1f}\n",
        b->name().c_str(), model.c_str(), static_cast<long long>(m.n_params()), batch, static_cast<long long>(images),
        secs, static_cast<double>(images) / secs, accuracy < 0 ? "null" : std::to_string(accuracy).c_str(),
        seconds_since(t_start), peak_rss_mib());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_models: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
