// The sample federated apps, run as a user runs them at a tiny size: each trains a whole
// federation (server, edge, devices) in its one process and reports the final test accuracy.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "../support/cifar_files.h"
#include "../support/run_cleave.h"

using cleave::testing::run_program;
namespace fs = std::filesystem;

namespace {

// The accuracy an app printed on its "final test accuracy X" line (-1: none).
double final_accuracy(const std::string& out) {
  const std::string key = "final test accuracy ";
  const auto at = out.find(key);
  return at == std::string::npos ? -1.0 : std::stod(out.substr(at + key.size()));
}

std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// A 10-class 28x28 IDX data set whose class is the bright band of rows: learnable in a few steps.
void write_idx(const fs::path& dir, int n_train, int n_test) {
  fs::create_directories(dir);
  std::uint32_t state = 7;
  auto next = [&state] { return (state = state * 1664525u + 1013904223u) >> 24; };
  for (auto [prefix, n] : {std::pair{"train", n_train}, std::pair{"t10k", n_test}}) {
    std::string img = be32(0x803) + be32(static_cast<std::uint32_t>(n)) + be32(28) + be32(28);
    std::string lab = be32(0x801) + be32(static_cast<std::uint32_t>(n));
    for (int i = 0; i < n; ++i) {
      const int c = static_cast<int>(next() % 10);
      for (int p = 0; p < 784; ++p) {
        const int band = (p / 28) / 3;
        const int v = (band == c ? 180 : 40) + static_cast<int>(next() % 60) - 30;
        img.push_back(static_cast<char>(std::clamp(v, 0, 255)));
      }
      lab.push_back(static_cast<char>(c));
    }
    std::ofstream(dir / (std::string(prefix) + "-images-idx3-ubyte"), std::ios::binary) << img;
    std::ofstream(dir / (std::string(prefix) + "-labels-idx1-ubyte"), std::ios::binary) << lab;
  }
}

}  // namespace

TEST_CASE("the activity app learns six activities from simulated users well above chance") {
  const auto r =
      run_program(CLEAVE_ACTIVITY, {"--users", "3", "--windows", "160", "--test-users", "3", "--test-windows", "60",
                                    "--rounds", "5", "--local-steps", "20", "--batch", "16", "--min-accuracy", "0.5"});
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(r.output.find("user 1: gait") != std::string::npos);
  CHECK(r.output.find("round 5:") != std::string::npos);
  CHECK(final_accuracy(r.output) > 0.5);  // chance: 1/6
}

TEST_CASE("the fashion_mnist app trains a server, an edge and three devices in one process") {
  const auto dir = cleave::testing::cifar_temp_dir("fmnist-app");  // (any temporary folder)
  write_idx(dir / "idx", 600, 200);
  const auto r = run_program(
      CLEAVE_FASHION_MNIST, {"--data", (dir / "idx").string(), "--devices", "3", "--rounds", "2", "--local-steps", "10",
                             "--batch", "16", "--partition", "dirichlet:0.5", "--min-accuracy", "0.3"});
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(r.output.find("600 training images (1,28,28), 10 classes; 3 devices, dirichlet:0.5 shards") !=
        std::string::npos);
  CHECK(r.output.find("round 2: 3 devices") != std::string::npos);
  CHECK(final_accuracy(r.output) >= 0.3);
}

TEST_CASE("the cifar_resnet app runs a ResNet split across device, edge and server on a CIFAR-10 directory") {
  const auto dir = cleave::testing::cifar_temp_dir("resnet-app");
  fs::create_directories(dir / "cifar-10-batches-bin");
  cleave::testing::write_cifar10(dir / "cifar-10-batches-bin", {8, 8, 8, 4, 4}, 10);
  const auto r = run_program(CLEAVE_CIFAR_RESNET, {"--data", dir.string(), "--model", "resnet8", "--devices", "2",
                                                   "--rounds", "1", "--local-steps", "2", "--batch", "4"});
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(r.output.find("32 training images (3,32,32), 10 classes; resnet8; 2 devices") != std::string::npos);
  CHECK(r.output.find("round 1: 2 devices") != std::string::npos);
  CHECK(final_accuracy(r.output) >= 0.0);
  // A model the zoo lacks is refused with the list it has.
  const auto bad = run_program(CLEAVE_CIFAR_RESNET, {"--data", dir.string(), "--model", "vgg"});
  CHECK(bad.status == 2);
  CHECK(bad.output.find("unknown model 'vgg'") != std::string::npos);
}
