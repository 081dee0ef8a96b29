// The CUDA backend as a plugin: the registry finds and loads it when asked (CLEAVE_CUDA_PLUGIN
// here, set before the first probe), its probe answers (a device, or the CUDA runtime's reason),
// and the cleave binary itself needs no CUDA library to start.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "cleave/backend/registry.h"
#include "cleave/core/error.h"
#include "run_cleave.h"

namespace {

using namespace cleave;

backend::backend_info cuda_info() {
  for (const auto& b : backend::list_backends())
    if (b.name == "cuda") return b;
  FAIL("cuda is not in list_backends()");
  return {};
}

}  // namespace

TEST_CASE("the registry loads the CUDA plugin and its probe answers") {
  const auto info = cuda_info();
  MESSAGE("cuda: " << info.detail);
  CHECK(info.detail.find("plugin unavailable") == std::string::npos);
  CHECK(info.detail.find("no NVIDIA driver") == std::string::npos);
  if (info.available) {
    CHECK(info.real_gpu);
    return;
  }
  // The plugin's own reason, the one the CUDA runtime gives.
  CHECK(!info.detail.empty());
  std::string what;
  try {
    backend::make_backend("cuda");
  } catch (const core::error& e) {
    what = e.what();
  }
  CHECK(what.find(info.detail) != std::string::npos);
}

TEST_CASE("the cleave binary does not link the CUDA libraries") {
  const std::string needed = cleave::testing::run_program("/usr/bin/readelf", {"-d", CLEAVE_BINARY}).output;
  REQUIRE(needed.find("NEEDED") != std::string::npos);
  CHECK(needed.find("libcudart") == std::string::npos);
  CHECK(needed.find("libcublas") == std::string::npos);
  CHECK(needed.find("libcudnn") == std::string::npos);
}

int main(int argc, char** argv) {
  ::setenv("CLEAVE_CUDA_PLUGIN", CLEAVE_CUDA_PLUGIN_FILE, 1);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
