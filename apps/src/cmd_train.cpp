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
  core::optimizer_kind optimizer = core::optimizer_kind::sgd;
  core::schedule_kind schedule = core::schedule_kind::constant;
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

using strings = std::vector<std::string>;

// The options of `cleave train`; `cleave eval` takes the first five and its own --checkpoint.
const option_table<train_options>& train_table() {
  using O = train_options;
  static const option_table<O> t = [] {
    option_table<O> t;
    t.push_back(value<O>(
        "model", "NAME|FILE", "a zoo model (`cleave models` lists them) or a .json spec file",
        [](O & o) -> auto& { return o.model; }));
    t.push_back(value<O>(
        "data", "NAME|DIR", "'fashion-mnist' or a directory of IDX or CIFAR binary files",
        [](O & o) -> auto& { return o.data; }));
    t.push_back(value<O>(
        "backend", "NAME", "reference, onednn, vulkan[:dev], cuda[:dev] or auto",
        [](O & o) -> auto& { return o.backend; }));
    t.push_back(value<O>(
                    "batch", "N", "batch size", [](O & o) -> auto& { return o.batch; })
                    .in(CLI::Range(1, 1 << 16)));
    t.push_back(value<O>(
        "seed", "N", "seed of weights, data order and dropout", [](O & o) -> auto& { return o.seed; }));
    t.push_back(value<O>(
                    "epochs", "N", "epochs", [](O & o) -> auto& { return o.epochs; })
                    .in(CLI::Range(1, 100000)));
    t.push_back(parsed<O>(
        "optimizer", "NAME", "sgd or adamw",
        [](O& o, const std::string& v) { o.optimizer = core::parse_optimizer_kind(v); },
        [](const O& o) { return strings{o.optimizer == core::optimizer_kind::adamw ? "adamw" : "sgd"}; }));
    t.push_back(value<O>(
                    "lr", "X", "learning rate", [](O & o) -> auto& { return o.lr; })
                    .in(CLI::PositiveNumber));
    t.push_back(value<O>(
                    "momentum", "X", "SGD momentum", [](O & o) -> auto& { return o.momentum; })
                    .in(CLI::Range(0.0, 1.0)));
    t.push_back(flag<O>(
        "nesterov", "Nesterov momentum", [](O & o) -> auto& { return o.nesterov; }));
    t.push_back(value<O>(
                    "weight-decay", "X", "weight decay", [](O & o) -> auto& { return o.weight_decay; })
                    .in(CLI::NonNegativeNumber));
    t.push_back(parsed<O>(
        "schedule", "NAME", "learning-rate schedule: constant, step (x0.1 per epoch) or cosine",
        [](O& o, const std::string& v) { o.schedule = core::parse_schedule_kind(v); },
        [](const O& o) {
          return strings{o.schedule == core::schedule_kind::step     ? "step"
                         : o.schedule == core::schedule_kind::cosine ? "cosine"
                                                                     : "constant"};
        }));
    t.push_back(value<O>(
                    "warmup", "N", "linear warm-up steps", [](O & o) -> auto& { return o.warmup; })
                    .in(CLI::NonNegativeNumber));
    t.push_back(value<O>(
        "checkpoint", "PATH", "checkpoint written after each epoch (default: MODEL.ckpt)",
        [](O & o) -> auto& { return o.checkpoint; }));
    t.push_back(value<O>(
        "resume", "PATH", "continue from a checkpoint", [](O & o) -> auto& { return o.resume; }));
    t.push_back(parsed<O, std::int64_t>(
                    "max-steps", "N", "stop each epoch after this many steps (quick runs)",
                    [](O& o, const std::int64_t& v) { o.max_steps = v; },
                    [](const O& o) { return o.max_steps < 0 ? strings{} : strings{std::to_string(o.max_steps)}; })
                    .in(CLI::NonNegativeNumber));
    t.push_back(augment_option<O>([](O & o) -> auto& { return o.augment; }));
    return t;
  }();
  return t;
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
  c.opt.kind = o.optimizer;
  c.opt.lr = o.lr;
  c.opt.momentum = o.momentum;
  c.opt.nesterov = o.nesterov;
  c.opt.weight_decay = o.weight_decay;
  c.opt.schedule = o.schedule;
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
    auto ck = core::capture(t.model_stage(), t.opt(), o.seed, e + 1);
    ck.meta = data.train.input_normalisation();  // for the model exported from it
    core::save_checkpoint(ckpt, ck);
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

std::vector<option_doc> train_option_docs() {
  return describe(train_table(), train_options{});
}

void register_train_commands(CLI::App& app) {
  static train_options o;  // lives as long as the app's callbacks

  auto* train = app.add_subcommand("train", "train a model locally on one backend");
  add_options(*train, train_table(), o);
  train->callback([] { run_train(o); });

  auto* eval = app.add_subcommand("eval", "evaluate a checkpoint on a data set's test split");
  option_table<train_options> common(train_table().begin(), train_table().begin() + 5);
  common.push_back(value<train_options>(
                       "checkpoint", "PATH", "checkpoint file", [](train_options & t) -> auto& { return t.checkpoint; })
                       .needed());
  add_options(*eval, common, o);
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
