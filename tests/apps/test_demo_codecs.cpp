// `cleave demo` split across device, edge and server with compressed cuts: int8 activations
// and gradients reach the accuracy of the f32 run (within half a point) and move a fraction of
// its bytes. Both runs use the demo's default size and a fixed split (every step crosses both
// cuts), the same seed and data order.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "run_cleave.h"

namespace {

namespace fs = std::filesystem;
using cleave::testing::run_cleave;

struct outcome {
  double accuracy = -1, mb_moved = -1;  // the final test accuracy; MB moved in the last round
};

outcome split_demo(const std::string& codecs) {
  const fs::path work = fs::temp_directory_path() / ("cleave-demo-codecs-" + std::to_string(::getpid()));
  fs::remove_all(work);
  const auto r = run_cleave({"demo", "--no-emulation", "--no-adapt", "--codecs", codecs, "--work", work.string()});
  fs::remove_all(work);
  INFO(r.output);
  REQUIRE(r.status == 0);
  outcome o;
  const std::string fin = "training finished after 8 rounds: test accuracy ";
  const auto at = r.output.find(fin);
  REQUIRE(at != std::string::npos);
  o.accuracy = std::stod(r.output.substr(at + fin.size(), 8));
  const auto last = r.output.find("round 8/8: ");
  REQUIRE(last != std::string::npos);
  const auto moved = r.output.find(" MB moved", last);
  REQUIRE(moved != std::string::npos);
  const auto from = r.output.rfind(' ', moved - 1);
  o.mb_moved = std::stod(r.output.substr(from + 1, moved - from - 1));
  // A fixed split: the devices hold the bottom blocks, edge and server the rest, all run long.
  CHECK(r.output.find("device[0,3) edge[3,8) server[8,12)") != std::string::npos);
  return o;
}

}  // namespace

TEST_CASE("a split demo with int8 activations and gradients reaches the f32 accuracy within half a point") {
  const outcome f32 = split_demo("f32");
  const outcome int8 = split_demo("int8");
  MESSAGE("f32 accuracy " << f32.accuracy << ", " << f32.mb_moved << " MB in the last round; int8 " << int8.accuracy
                          << ", " << int8.mb_moved << " MB");
  CHECK(f32.accuracy > 0.80);
  CHECK(int8.accuracy >= f32.accuracy - 0.005);
  // Step tensors dominate what crosses: int8 moves well under half the bytes.
  CHECK(int8.mb_moved < 0.4 * f32.mb_moved);
}
