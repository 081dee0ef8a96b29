// Trains a zoo model for some epochs on one backend and prints one JSON line with the
// throughput (images/s over the training loop) and the test accuracy. Used by run.sh.
// Usage: bench_train [--backend B] [--model M] [--data D] [--epochs E] [--batch N]
//                    [--lr LR] [--momentum M] [--schedule constant|step|cosine]
//                    [--max-steps S] [--seed S]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "cleave/backend/registry.h"
#include "cleave/core/trainer.h"

int main(int argc, char** argv) {
  std::string backend = "onednn", model = "lenet5", data = "fashion-mnist", schedule = "constant";
  int epochs = 1, batch = 64;
  float lr = 0.05f, momentum = 0.9f;
  long long max_steps = -1, seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--backend")
      backend = v;
    else if (k == "--model")
      model = v;
    else if (k == "--data")
      data = v;
    else if (k == "--epochs")
      epochs = std::stoi(v);
    else if (k == "--batch")
      batch = std::stoi(v);
    else if (k == "--lr")
      lr = std::stof(v);
    else if (k == "--momentum")
      momentum = std::stof(v);
    else if (k == "--schedule")
      schedule = v;
    else if (k == "--max-steps")
      max_steps = std::stoll(v);
    else if (k == "--seed")
      seed = std::stoll(v);
    else {
      std::fprintf(stderr, "bench_train: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    using namespace cleave;
    const auto d = core::load_dataset(data);
    const auto m = core::resolve_model(model, d.train.item, d.train.n_classes);
    auto b = backend::make_backend(backend);
    core::train_config c;
    c.batch = batch;
    c.epochs = epochs;
    c.seed = static_cast<std::uint64_t>(seed);
    c.opt.lr = lr;
    c.opt.momentum = momentum;
    c.opt.schedule = core::parse_schedule_kind(schedule);
    c.max_steps = max_steps;
    core::fit_schedule(c, d.train.size());
    core::trainer t(*b, m, c);
    double train_secs = 0.0;
    std::int64_t images = 0;
    core::eval_report ev;
    for (int e = 0; e < epochs; ++e) {
      const auto t0 = std::chrono::steady_clock::now();
      images += t.train_epoch(d.train, e, {});
      train_secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ev = t.evaluate(d.test);
      std::fprintf(stderr, "bench_train: %s epoch %d: test accuracy %.4f\n", b->name().c_str(), e + 1, ev.accuracy);
    }
    std::printf(
        "{\"framework\": \"cleave\", \"backend\": \"%s\", \"model\": \"%s\", \"epochs\": %d, \"images\": %lld, "
        "\"train_seconds\": %.3f, \"images_per_s\": %.1f, \"test_accuracy\": %.4f}\n",
        b->name().c_str(), model.c_str(), epochs, static_cast<long long>(images), train_secs,
        static_cast<double>(images) / train_secs, ev.accuracy);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
