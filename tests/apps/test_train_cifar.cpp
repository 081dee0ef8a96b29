// `cleave train` on a CIFAR directory with --augment, as a user runs it, and the --augment
// option of the commands that train: a bad list is refused with the text named. The model
// exported from it carries its inputs' normalisation.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "../support/cifar_files.h"
#include "../support/run_cleave.h"
#include "../support/safetensors_reader.h"

using cleave::testing::cifar_temp_dir;
using cleave::testing::run_cleave;
using cleave::testing::write_cifar10;
namespace fs = std::filesystem;

TEST_CASE("cleave train runs resnet8 on a CIFAR-10 directory with augmented batches") {
  const auto dir = cifar_temp_dir("train");
  fs::create_directories(dir / "cifar-10-batches-bin");
  write_cifar10(dir / "cifar-10-batches-bin", {4, 4, 4, 2, 2}, 6);
  const auto ckpt = (dir / "resnet8.ckpt").string();
  const auto r = run_cleave({"train", "--data", dir.string(), "--model", "resnet8", "--backend", "reference", "--batch",
                             "4", "--max-steps", "2", "--augment", "--checkpoint", ckpt});
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(r.output.find("(16 train / 6 test, 10 classes)") != std::string::npos);
  CHECK(r.output.find("augmenting the training batches (crop:4,flip)") != std::string::npos);
  CHECK(r.output.find("test accuracy") != std::string::npos);
  CHECK(fs::exists(ckpt));
}

TEST_CASE("a model exported from cleave train carries the per-channel normalisation of its training inputs") {
  const auto dir = cifar_temp_dir("norm");
  fs::create_directories(dir / "cifar-10-batches-bin");
  write_cifar10(dir / "cifar-10-batches-bin", {4, 4, 4, 2, 2}, 6);
  const auto ckpt = (dir / "m.ckpt").string(), out = (dir / "m.safetensors").string();
  const auto r = run_cleave({"train", "--data", dir.string(), "--model", "resnet8", "--backend", "reference", "--batch",
                             "4", "--max-steps", "1", "--checkpoint", ckpt});
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto e = run_cleave({"export", "--checkpoint", ckpt, "--out", out});
  INFO(e.output);
  REQUIRE(e.status == 0);
  const auto f = cleave::testing::read_safetensors(out);
  const auto mean = nlohmann::json::parse(f.metadata.at("input_mean").get<std::string>());
  const auto stdev = nlohmann::json::parse(f.metadata.at("input_std").get<std::string>());
  REQUIRE(mean.size() == 3);
  REQUIRE(stdev.size() == 3);
  // The 16 training records' pixels, scaled to [0,1], per channel.
  for (int c = 0; c < 3; ++c) {
    double sum = 0, sq = 0;
    for (int s = 0; s < 16; ++s)
      for (int j = c * 1024; j < (c + 1) * 1024; ++j) {
        const double v = cleave::testing::cifar_pixel(0, s, j) / 255.0;
        sum += v;
        sq += v * v;
      }
    const double m = sum / (16 * 1024), sd = std::sqrt(sq / (16 * 1024) - m * m);
    CHECK(mean[c].get<double>() == doctest::Approx(m).epsilon(1e-5));
    CHECK(stdev[c].get<double>() == doctest::Approx(sd).epsilon(1e-5));
  }
}

TEST_CASE("a bad --augment list is refused by every command that trains, naming the text") {
  const std::string msg = "augment 'rotate': expected crop, crop:PAD, flip or both separated by ','";
  const auto t = run_cleave({"train", "--data", "/nonexistent", "--augment", "rotate"});
  CHECK(t.status != 0);
  CHECK(t.output.find(msg) != std::string::npos);
  const auto a = run_cleave({"agent", "--certs", "/nonexistent", "--id", "1", "--augment", "rotate"});
  CHECK(a.status != 0);
  CHECK(a.output.find(msg) != std::string::npos);
  const auto d = run_cleave({"demo", "--augment", "crop:0"});
  CHECK(d.status != 0);
  CHECK(d.output.find("augment 'crop:0': crop padding must be in [1, 1024], got 0") != std::string::npos);
  for (const char* cmd : {"train", "agent", "demo"}) {
    CAPTURE(cmd);
    const auto h = run_cleave({cmd, "--help"});
    CHECK(h.output.find("--augment") != std::string::npos);
  }
}
