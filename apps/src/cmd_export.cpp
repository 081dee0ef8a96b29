// `cleave export`: a checkpoint's model as a safetensors file under PyTorch's state_dict names.
#include <spdlog/spdlog.h>

#include "cleave/core/checkpoint.h"
#include "cleave/core/torch_export.h"
#include "commands.h"

namespace cleave::apps {

namespace {

struct export_options {
  std::string checkpoint;
  std::string out;
  std::string model;  // the model the checkpoint must hold ("": whichever it holds)
};

void run_export(const export_options& o) {
  const auto ck = core::load_checkpoint(o.checkpoint);
  const auto model = core::parse_model_spec(ck.model_json, o.checkpoint);
  if (!o.model.empty()) {
    const auto want = core::resolve_model(o.model, model.input, model.n_classes);
    if (want.json != model.json)
      throw core::error("checkpoint '" + o.checkpoint + "' holds model '" + model.name + "', not '" + o.model +
                        (want.name == model.name ? "' as given (its spec differs)" : "'"));
  }
  const auto state = core::torch_state_dict(ck, model, o.checkpoint);
  core::save_safetensors(o.out, state.tensors, state.metadata);
  std::int64_t n_values = 0;
  for (const auto& t : state.tensors)
    if (t.dtype == "F32") n_values += static_cast<std::int64_t>(t.bytes.size() / 4);
  spdlog::info("{} (model {}, epoch {}, step {}): {} tensors, {} values written to {}", o.checkpoint, model.name,
               ck.epoch, ck.step, state.tensors.size(), n_values, o.out);
}

}  // namespace

void register_export_command(CLI::App& app) {
  static export_options o;  // lives as long as the app's callbacks
  auto* c = app.add_subcommand("export", "write a checkpoint's model as safetensors, named as PyTorch names it");
  c->add_option("--checkpoint", o.checkpoint, "checkpoint file (of `cleave train` or `cleave server`)")->required();
  c->add_option("--out", o.out, "safetensors file to write (replaced atomically)")->required();
  c->add_option("--model", o.model, "refuse a checkpoint of another model (zoo name or .json spec file)");
  c->callback([] { run_export(o); });
}

}  // namespace cleave::apps
