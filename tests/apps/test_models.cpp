// `cleave models`: the zoo list and one model's per-block table, run as a user runs them, and
// the errors of a bad input shape or name, each naming what was given.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../support/run_cleave.h"

using cleave::testing::run_cleave;

namespace {

// The line of `out` that starts with `prefix` (after leading spaces), or "".
std::string line_starting(const std::string& out, const std::string& prefix) {
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) {
    const auto first = l.find_first_not_of(' ');
    if (first != std::string::npos && l.compare(first, prefix.size(), prefix) == 0) return l;
  }
  return "";
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

}  // namespace

TEST_CASE("the list shows every zoo model with parameters, FLOPs and the input used") {
  const auto r = run_cleave({"models"});
  INFO(r.output);
  REQUIRE(r.status == 0);
  for (const std::string name : {"mlp", "lenet5", "resnet8", "resnet18", "vgg11-bn"}) {
    CAPTURE(name);
    const auto l = line_starting(r.output, name + " ");
    REQUIRE_FALSE(l.empty());
    CHECK(l.find("1x28x28, 10 classes") != std::string::npos);
  }
  CHECK(words(line_starting(r.output, "lenet5 "))[2] == "61706");
  CHECK(words(line_starting(r.output, "resnet18 "))[2] == std::to_string(11173962 - 2 * 64 * 9));
}

TEST_CASE("resnet18's table on 3x32x32 has one row per block and torchvision's parameter total") {
  const auto r = run_cleave({"models", "resnet18", "--input", "3,32,32", "--classes", "10", "--backend", "auto"});
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("resnet18 on 3x32x32, 10 classes: 13 blocks") != std::string::npos);
  const auto total = words(line_starting(r.output, "total "));
  REQUIRE(total.size() >= 2);
  CHECK(total[1] == "11173962");
  // Block 3, the first basic block: two 3x3 convs of 64 channels and two batch norms.
  const auto b3 = words(line_starting(r.output, "3 "));
  REQUIRE(b3.size() >= 4);
  CHECK(b3[1] == "residual");
  CHECK(b3[2] == "64x32x32");
  CHECK(b3[3] == "73984");
  CHECK(r.output.find("256.0 KiB") != std::string::npos);  // 64x32x32 f32 = 256 KiB at a cut
  CHECK(words(line_starting(r.output, "12 "))[2] == "10");
}

TEST_CASE("CxHxW is read as C,H,W and a spec file is shown with its own input") {
  const auto r = run_cleave({"models", "lenet5", "--input", "1x28x28", "--backend", "reference"});
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(words(line_starting(r.output, "total "))[1] == "61706");

  const auto spec = std::filesystem::temp_directory_path() / ("cleave-models-" + std::to_string(::getpid()) + ".json");
  std::ofstream(spec)
      << R"({"name": "tiny", "input": [4], "classes": 3, "blocks": [{"type": "linear", "out_features": 3}]})";
  const auto s = run_cleave({"models", spec.string(), "--backend", "reference"});
  std::filesystem::remove(spec);
  INFO(s.output);
  REQUIRE(s.status == 0);
  CHECK(s.output.find("tiny on 4, 3 classes: 1 blocks") != std::string::npos);
  CHECK(words(line_starting(s.output, "total "))[1] == "15");
}

TEST_CASE("a bad input shape, model name or class count is refused naming it") {
  auto r = run_cleave({"models", "resnet18", "--input", "3x32"});
  CHECK(r.status == 1);
  CHECK(r.output.find("--input '3x32': 2 dimensions (expected C,H,W or CxHxW") != std::string::npos);
  r = run_cleave({"models", "resnet18", "--input", "3,a,32"});
  CHECK(r.status == 1);
  CHECK(r.output.find("--input '3,a,32': unexpected character 'a'") != std::string::npos);
  r = run_cleave({"models", "--input", "0,28,28"});
  CHECK(r.status == 1);
  CHECK(r.output.find("--input '0,28,28': dimension 0 is out of range") != std::string::npos);
  r = run_cleave({"models", "vgg11_bn"});
  CHECK(r.status == 1);
  CHECK(r.output.find("unknown model 'vgg11_bn' (did you mean 'vgg11-bn'?)") != std::string::npos);
  r = run_cleave({"models", "resnet18", "--classes", "1"});
  CHECK(r.status != 0);
  CHECK(r.output.find("--classes") != std::string::npos);
}
