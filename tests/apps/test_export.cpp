// `cleave export`: checkpoints of the zoo models written as safetensors under PyTorch's names,
// read back here with a reader of our own; the errors a user can make, each naming the file.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/safetensors_reader.h"
#include "cleave/backend/registry.h"
#include "cleave/core/checkpoint.h"
#include "cleave/core/random.h"
#include "cleave/core/trainer.h"

#include "../support/run_cleave.h"

using namespace cleave;
using cleave::testing::outcome;
using cleave::testing::run_cleave;
namespace fs = std::filesystem;
using json = nlohmann::json;
using cleave::testing::read_safetensors;

namespace {

struct scratch_dir {
  fs::path dir;
  explicit scratch_dir(const std::string& name)
      : dir(fs::temp_directory_path() / ("cleave-export-" + std::to_string(::getpid()) + "-" + name)) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

bool is_large(const std::string& model) {
  return model == "resnet18" || model == "vgg11-bn";
}

// onednn where this build has it: the reference backend takes seconds per step of resnet18.
std::string fast_backend() {
  for (const auto& b : backend::list_backends())
    if (b.name == "onednn" && b.available) return b.name;
  return "reference";
}

// A checkpoint of `model` (1x28x28 inputs, 10 classes) after two SGD steps on random data, so
// that weights and batch-norm statistics are no longer their initial values.
core::checkpoint trained_checkpoint(const std::string& model) {
  const auto m = core::zoo_model(model, core::shape{1, 28, 28}, 10);
  auto be = backend::make_backend(is_large(model) ? fast_backend() : "reference");
  core::train_config c;
  c.seed = 7;
  core::trainer t(*be, m, c);
  const int n = is_large(model) ? 2 : 4;
  std::vector<float> x(static_cast<std::size_t>(n) * 784);
  std::vector<std::int32_t> y(static_cast<std::size_t>(n));
  core::rng r(11);
  for (int s = 0; s < 2; ++s) {
    for (auto& v : x) v = static_cast<float>(r.below(1000)) / 500.0f - 1.0f;
    for (int i = 0; i < n; ++i) y[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(r.below(10));
    t.step(x.data(), y.data(), n);
  }
  return core::capture(t.model_stage(), t.opt(), 7, 1);
}

std::string as_bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)};
}

struct expected_tensor {
  std::string torch, cleave;  // the PyTorch name, the checkpoint's name ("" for num_batches_tracked)
  std::vector<std::int64_t> shape;
};

void add_bn(std::vector<expected_tensor>& e, const std::string& torch, const std::string& block, std::int64_t c) {
  e.push_back({torch + ".weight", "p:" + block + ".weight", {c}});
  e.push_back({torch + ".bias", "p:" + block + ".bias", {c}});
  e.push_back({torch + ".running_mean", "s:" + block + ".running_mean", {c}});
  e.push_back({torch + ".running_var", "s:" + block + ".running_var", {c}});
  e.push_back({torch + ".num_batches_tracked", "", {}});
}

// What a PyTorch state_dict of each zoo model (1x28x28, 10 classes) holds, and where cleave
// keeps each tensor.
std::vector<expected_tensor> expected_state_dict(const std::string& model) {
  std::vector<expected_tensor> e;
  auto layer = [&](const std::string& torch, const std::string& block, std::vector<std::int64_t> w, bool bias) {
    e.push_back({torch + ".weight", "p:" + block + ".weight", w});
    if (bias) e.push_back({torch + ".bias", "p:" + block + ".bias", {w[0]}});
  };
  if (model == "mlp") {
    layer("fc1", "1", {256, 784}, true);
    layer("fc2", "3", {128, 256}, true);
    layer("fc3", "5", {10, 128}, true);
  } else if (model == "lenet5") {
    layer("conv1", "0", {6, 1, 5, 5}, true);
    layer("conv2", "3", {16, 6, 5, 5}, true);
    layer("fc1", "7", {120, 400}, true);
    layer("fc2", "9", {84, 120}, true);
    layer("fc3", "11", {10, 84}, true);
  } else if (model == "vgg11-bn") {
    // On 28x28 the fifth max pool is left out: features end at block 27, flatten, classifier.
    int block = 0;
    std::int64_t in = 1;
    for (const std::int64_t c : {64, 0, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512}) {
      if (c == 0) {
        ++block;
        continue;
      }
      layer("features." + std::to_string(block), std::to_string(block), {c, in, 3, 3}, true);
      add_bn(e, "features." + std::to_string(block + 1), std::to_string(block + 1), c);
      block += 3;
      in = c;
    }
    layer("classifier", std::to_string(block + 1), {10, 512}, true);
  } else {
    // resnet8: one basic block per stage, 16/32/64 wide; resnet18: two per stage, 64..512.
    const bool r18 = model == "resnet18";
    const int per_stage = r18 ? 2 : 1;
    const std::vector<std::int64_t> widths =
        r18 ? std::vector<std::int64_t>{64, 128, 256, 512} : std::vector<std::int64_t>{16, 32, 64};
    layer("conv1", "0", {widths[0], 1, 3, 3}, false);
    add_bn(e, "bn1", "1", widths[0]);
    int block = 3;
    std::int64_t in = widths[0];
    for (std::size_t k = 0; k < widths.size(); ++k)
      for (int j = 0; j < per_stage; ++j, ++block) {
        const std::string t = "layer" + std::to_string(k + 1) + "." + std::to_string(j), b = std::to_string(block);
        const std::int64_t out = widths[k];
        layer(t + ".conv1", b + ".body.0", {out, in, 3, 3}, false);
        add_bn(e, t + ".bn1", b + ".body.1", out);
        layer(t + ".conv2", b + ".body.3", {out, out, 3, 3}, false);
        add_bn(e, t + ".bn2", b + ".body.4", out);
        if (in != out) {
          layer(t + ".downsample.0", b + ".shortcut.0", {out, in, 1, 1}, false);
          add_bn(e, t + ".downsample.1", b + ".shortcut.1", out);
        }
        in = out;
      }
    layer("fc", std::to_string(block + 1), {10, widths.back()}, true);
  }
  return e;
}

}  // namespace

TEST_CASE("a checkpoint of each zoo model exports as safetensors with PyTorch's names, shapes and values") {
  scratch_dir w("zoo");
  for (const std::string model : {"mlp", "lenet5", "resnet8", "resnet18", "vgg11-bn"}) {
    CAPTURE(model);
    const auto ck = trained_checkpoint(model);
    const fs::path ckpt = w.dir / (model + ".ckpt"), out = w.dir / (model + ".safetensors");
    core::save_checkpoint(ckpt.string(), ck);
    const auto r = run_cleave({"export", "--checkpoint", ckpt.string(), "--out", out.string(), "--model", model});
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK_FALSE(fs::exists(out.string() + ".tmp"));
    const auto f = read_safetensors(out);

    const auto expected = expected_state_dict(model);
    CHECK(f.tensors.size() == expected.size());
    for (const auto& e : expected) {
      CAPTURE(e.torch);
      const auto it = f.tensors.find(e.torch);
      REQUIRE(it != f.tensors.end());
      CHECK(it->second.shape == e.shape);
      if (e.cleave.empty()) {  // num_batches_tracked: the checkpoint's steps
        CHECK(it->second.dtype == "I64");
        std::int64_t v = -1;
        REQUIRE(it->second.bytes.size() == 8);
        std::memcpy(&v, it->second.bytes.data(), 8);
        CHECK(v == ck.step);
        continue;
      }
      CHECK(it->second.dtype == "F32");
      const auto* src = ck.find(e.cleave);
      REQUIRE(src);
      CHECK(it->second.bytes == as_bytes(src->values));
    }
    CHECK(f.metadata.at("format") == "pt");
    CHECK(f.metadata.at("model") == model);
    CHECK(f.metadata.at("step") == std::to_string(ck.step));
    CHECK(core::parse_model_spec(f.metadata.at("model_spec").get<std::string>()).json == ck.model_json);
  }
}

TEST_CASE("a batch norm's running statistics are exported as trained, not as initialised") {
  const auto ck = trained_checkpoint("resnet8");
  const auto* var = ck.find("s:1.running_var");
  REQUIRE(var);
  bool moved = false;
  for (float v : var->values) moved = moved || v != 1.0f;
  CHECK(moved);  // so the value comparison above covers real statistics
}

TEST_CASE("a missing or foreign checkpoint is refused naming it, and no output file is left") {
  scratch_dir w("errors");
  const fs::path out = w.dir / "model.safetensors";
  auto refused = [&](const fs::path& ckpt, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"export", "--checkpoint", ckpt.string(), "--out", out.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = run_cleave(args);
    CHECK(r.status == 1);
    CHECK_FALSE(fs::exists(out));
    CHECK_FALSE(fs::exists(out.string() + ".tmp"));
    return r.output;
  };
  CHECK(refused(w.dir / "none.ckpt").find("checkpoint '" + (w.dir / "none.ckpt").string() + "': cannot open") !=
        std::string::npos);

  const auto lenet = trained_checkpoint("lenet5");
  const fs::path good = w.dir / "lenet5.ckpt";
  core::save_checkpoint(good.string(), lenet);
  CHECK(refused(good, {"--model", "mlp"}).find("checkpoint '" + good.string() + "' holds model 'lenet5', not 'mlp'") !=
        std::string::npos);

  // The spec of one model over the tensors of another.
  auto foreign = trained_checkpoint("mlp");
  foreign.model_json = lenet.model_json;
  const fs::path mixed = w.dir / "mixed.ckpt";
  core::save_checkpoint(mixed.string(), foreign);
  CHECK(refused(mixed).find("checkpoint '" + mixed.string() + "': no tensor 'p:0.weight' of model 'lenet5'") !=
        std::string::npos);

  auto reshaped = lenet;
  for (auto& t : reshaped.tensors)
    if (t.name == "p:7.weight") t.dims = core::shape{400, 120};
  const fs::path wrong = w.dir / "wrong.ckpt";
  core::save_checkpoint(wrong.string(), reshaped);
  CHECK(refused(wrong).find("checkpoint '" + wrong.string() +
                            "': tensor 'p:7.weight' has shape (400,120), model 'lenet5' has (120,400)") !=
        std::string::npos);

  auto short_of_one = lenet;
  std::erase_if(short_of_one.tensors, [](const core::checkpoint::entry& e) { return e.name == "p:11.bias"; });
  const fs::path missing = w.dir / "missing.ckpt";
  core::save_checkpoint(missing.string(), short_of_one);
  CHECK(refused(missing).find("no tensor 'p:11.bias'") != std::string::npos);
}

TEST_CASE("an output that cannot be written is an error naming it, and a file already there stays as it was") {
  scratch_dir w("out");
  const fs::path ckpt = w.dir / "mlp.ckpt";
  core::save_checkpoint(ckpt.string(), trained_checkpoint("mlp"));

  const fs::path nodir = w.dir / "missing" / "m.safetensors";
  auto r = run_cleave({"export", "--checkpoint", ckpt.string(), "--out", nodir.string()});
  CHECK(r.status == 1);
  CHECK(r.output.find("safetensors file '" + nodir.string() + "': cannot create") != std::string::npos);

  // A directory in the way: written, then not renamed into place; nothing is left behind.
  const fs::path dir = w.dir / "adir";
  fs::create_directories(dir / "inside");
  r = run_cleave({"export", "--checkpoint", ckpt.string(), "--out", dir.string()});
  CHECK(r.status == 1);
  CHECK(r.output.find("safetensors file '" + dir.string() + "': cannot rename") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.string() + ".tmp"));
  CHECK(fs::is_directory(dir / "inside"));

  // A failed export leaves the previous file untouched.
  const fs::path out = w.dir / "m.safetensors";
  std::ofstream(out) << "previous";
  r = run_cleave({"export", "--checkpoint", (w.dir / "none.ckpt").string(), "--out", out.string()});
  CHECK(r.status == 1);
  std::ifstream in(out);
  const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(kept == "previous");
}
