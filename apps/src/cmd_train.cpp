// `cleave train`, `cleave eval`, `cleave backends`: local work on one node.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

#include "cleave/backend/registry.h"
#include "cleave/core/checkpoint.h"
#include "cleave/core/trainer.h"
#include "commands.h"
#include "progress.h"

namespace cleave::apps {

namespace {

struct train_options {
  std::string model = "lenet5";
  std::string data = "fashion-mnist";
  std::string backend = "auto";
  std::string optimizer = "sgd";
  std::string schedule = "constant";
  std::string checkpoint;
  std::string resume;
  int epochs = 1;
  int batch = 64;
  float lr = 0.05f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  std::uint64_t seed = 1;
  std::int64_t max_steps = -1;
  int warmup = 0;
  core::augment_config augment;
};

void add_common(CLI::App* c, train_options& o) {
  c->add_option("--model", o.model, "a zoo model (`cleave models` lists them) or a .json spec file")
      ->capture_default_str();
  c->add_option("--data", o.data, "'fashion-mnist' or a directory of IDX or CIFAR binary files")->capture_default_str();
  c->add_option("--backend", o.backend, "reference, onednn, vulkan[:dev], cuda[:dev] or auto")->capture_default_str();
  c->add_option("--batch", o.batch, "batch size")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  c->add_option("--seed", o.seed, "seed of weights, data order and dropout")->capture_default_str();
}

std::string format_rate(double r) {
  return fmt::format("{:.0f} img/s", r);
}

void run_train(const train_options& o) {
  // A bad --resume is found before the data is read, not minutes later.
  std::optional<core::checkpoint> resumed;
  if (!o.resume.empty()) resumed = core::load_checkpoint(o.resume);
  const auto data = core::load_dataset(o.data);
  const auto model = core::resolve_model(o.model, data.train.item, data.train.n_classes);
  auto be = backend::make_backend(o.backend);
  core::train_config c;
  c.batch = o.batch;
  c.epochs = o.epochs;
  c.seed = o.seed;
  c.max_steps = o.max_steps;
  c.augment = o.augment;
  c.opt.kind = core::parse_optimizer_kind(o.optimizer);
  c.opt.lr = o.lr;
  c.opt.momentum = o.momentum;
  c.opt.nesterov = o.nesterov;
  c.opt.weight_decay = o.weight_decay;
  c.opt.schedule = core::parse_schedule_kind(o.schedule);
  c.opt.warmup_steps = o.warmup;
  core::fit_schedule(c, data.train.size());
  spdlog::info("training {} ({} blocks, {} parameters) on {} ({} train / {} test, {} classes) with backend {} ({})",
               model.name, model.n_blocks(), model.n_params(), o.data, data.train.size(), data.test.size(),
               data.train.n_classes, be->name(), be->device_name());
  if (o.augment.any()) spdlog::info("augmenting the training batches ({})", core::augment_str(o.augment));
  core::trainer t(*be, model, c);
  int first_epoch = 0;
  if (resumed) {
    const auto& ck = *resumed;
    core::restore(t.model_stage(), t.opt(), ck);
    first_epoch = static_cast<int>(ck.epoch);
    spdlog::info("resumed from {} at epoch {}, step {}", o.resume, ck.epoch, ck.step);
  }
  const std::string ckpt = o.checkpoint.empty() ? model.name + ".ckpt" : o.checkpoint;
  for (int e = first_epoch; e < o.epochs; ++e) {
    progress_bar bar(fmt::format("epoch {}/{}", e + 1, o.epochs));
    core::progress_report last;
    const auto t0 = std::chrono::steady_clock::now();
    t.train_epoch(data.train, e, [&](const core::progress_report& r) {
      last = r;
      bar.update(r.step, r.steps_per_epoch,
                 fmt::format("loss {:.4f} lr {:.4g} {}", r.loss, r.lr, format_rate(r.images_per_s)));
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bar.finish(fmt::format("loss {:.4f} {} in {:.1f} s", last.loss, format_rate(last.images_per_s), secs));
    const auto ev = t.evaluate(data.test);
    spdlog::info("epoch {}/{}: train loss {:.4f}, test loss {:.4f}, test accuracy {:.4f} ({} images), {}", e + 1,
                 o.epochs, last.loss, ev.loss, ev.accuracy, ev.n, format_rate(last.images_per_s));
    core::save_checkpoint(ckpt, core::capture(t.model_stage(), t.opt(), o.seed, e + 1));
    spdlog::info("saved checkpoint {}", ckpt);
  }
}

void run_eval(const train_options& o) {
  const auto ck = core::load_checkpoint(o.checkpoint);
  const auto data = core::load_dataset(o.data);
  const auto model = core::parse_model_spec(ck.model_json, o.checkpoint);
  if (!(model.input == data.test.item) || model.n_classes < data.test.n_classes)
    throw core::error("checkpoint '" + o.checkpoint + "' holds a model for input " + model.input.str() + " and " +
                      std::to_string(model.n_classes) + " classes; the data has " + data.test.item.str() + " and " +
                      std::to_string(data.test.n_classes));
  auto be = backend::make_backend(o.backend);
  core::train_config c;
  c.seed = ck.seed;
  // A server's checkpoint holds the global model without optimizer state ("none").
  if (ck.optimizer != "none") c.opt.kind = core::parse_optimizer_kind(ck.optimizer);
  core::trainer t(*be, model, c);
  core::restore(t.model_stage(), t.opt(), ck);
  const auto ev = t.evaluate(data.test);
  spdlog::info("{} (epoch {}, step {}) on {}: test loss {:.4f}, test accuracy {:.4f} ({} images)", o.checkpoint,
               ck.epoch, ck.step, o.data, ev.loss, ev.accuracy, ev.n);
}

}  // namespace

const char* const augment_help =
    "augment the training batches, seeded (evaluation never is): bare, random crop with 4 pixels of padding and "
    "horizontal flip; or a list of crop, crop:PAD, flip";

CLI::Option* add_augment_option(CLI::App* c, core::augment_config& a) {
  return c
      ->add_option_function<std::string>(
          "--augment", [&a](const std::string& text) { a = core::parse_augment(text); }, augment_help)
      ->expected(0, 1)
      ->default_str("crop:4,flip");
}

void register_train_commands(CLI::App& app) {
  static train_options o;  // lives as long as the app's callbacks

  auto* train = app.add_subcommand("train", "train a model locally on one backend");
  add_common(train, o);
  train->add_option("--epochs", o.epochs, "epochs")->capture_default_str()->check(CLI::Range(1, 100000));
  train->add_option("--optimizer", o.optimizer, "sgd or adamw")->capture_default_str();
  train->add_option("--lr", o.lr, "learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  train->add_option("--momentum", o.momentum, "SGD momentum")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  train->add_flag("--nesterov", o.nesterov, "Nesterov momentum");
  train->add_option("--weight-decay", o.weight_decay, "weight decay")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  train->add_option("--schedule", o.schedule, "learning-rate schedule: constant, step (x0.1 per epoch) or cosine")
      ->capture_default_str();
  train->add_option("--warmup", o.warmup, "linear warm-up steps")->capture_default_str()->check(CLI::NonNegativeNumber);
  train->add_option("--checkpoint", o.checkpoint, "checkpoint written after each epoch (default: MODEL.ckpt)");
  train->add_option("--resume", o.resume, "continue from a checkpoint");
  train->add_option("--max-steps", o.max_steps, "stop each epoch after this many steps (quick runs)")
      ->check(CLI::NonNegativeNumber);
  add_augment_option(train, o.augment);
  train->callback([] { run_train(o); });

  auto* eval = app.add_subcommand("eval", "evaluate a checkpoint on a data set's test split");
  add_common(eval, o);
  eval->add_option("--checkpoint", o.checkpoint, "checkpoint file")->required();
  eval->callback([] { run_eval(o); });

  auto* list = app.add_subcommand("backends", "list the compute backends and whether they can run here");
  list->callback([] {
    for (const auto& b : backend::list_backends())
      std::printf("%-10s %-12s %s\n", b.name.c_str(),
                  b.available ? (b.real_gpu ? "available*" : "available") : "unavailable", b.detail.c_str());
    std::printf("auto -> %s\n", backend::resolve_auto().c_str());
  });
}

}  // namespace cleave::apps
