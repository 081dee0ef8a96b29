// The cuda backend in the registry: it reports itself unavailable with the driver's reason
// when there is no GPU (and then never wins "auto"), and parses its device specs.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "cleave/backend/registry.h"
#include "cleave/core/error.h"
#include "cuda_backend.h"

namespace {

using namespace cleave;

backend::backend_info cuda_info() {
  for (const auto& b : backend::list_backends())
    if (b.name == "cuda") return b;
  FAIL("cuda is not in list_backends()");
  return {};
}

}  // namespace

TEST_CASE("the registry lists cuda first, with a reason or a device") {
  const auto all = backend::list_backends();
  REQUIRE(!all.empty());
  CHECK(all.front().name == "cuda");
  const auto info = cuda_info();
  CHECK(!info.detail.empty());
  CHECK(info.real_gpu == info.available);
}

TEST_CASE("without a usable GPU cuda is unavailable, says why, and auto falls back") {
  const auto info = cuda_info();
  if (info.available) {
    MESSAGE("a GPU is present: " << info.detail);
    CHECK(backend::resolve_auto() == "cuda");
    return;
  }
  MESSAGE("cuda unavailable: " << info.detail);
  CHECK(backend::resolve_auto() != "cuda");
  std::string what;
  try {
    backend::make_backend("cuda");
  } catch (const core::error& e) {
    what = e.what();
  }
  CHECK(what.find("backend 'cuda' is not available") != std::string::npos);
  CHECK(what.find(info.detail) != std::string::npos);
}

TEST_CASE("with a GPU the cuda backend is created by name and names its device") {
  const auto info = cuda_info();
  if (!info.available) return;  // covered by the case above
  auto b = backend::make_backend("cuda:0");
  CHECK(b->name() == "cuda");
  CHECK(!b->host_memory());
  CHECK(b->device_name().find("sm_") != std::string::npos);
}

TEST_CASE("cuda device specs give an index and the TF32 switch") {
  using backend::detail::parse_cuda_spec;
  unsetenv("CLEAVE_CUDA_TF32");
  CHECK(parse_cuda_spec("").device == 0);
  CHECK(!parse_cuda_spec("").tf32);
  CHECK(parse_cuda_spec("3").device == 3);
  CHECK(parse_cuda_spec("tf32").tf32);
  CHECK(parse_cuda_spec("tf32").device == 0);
  const auto s = parse_cuda_spec("1:tf32");
  CHECK(s.device == 1);
  CHECK(s.tf32);
  setenv("CLEAVE_CUDA_TF32", "1", 1);
  CHECK(parse_cuda_spec("2").tf32);
  unsetenv("CLEAVE_CUDA_TF32");
}

TEST_CASE("bad cuda device specs are refused with the expected form in the message") {
  using backend::detail::parse_cuda_spec;
  for (const char* bad : {"x", "0:", "0:1", "-1", "tf16", "0:tf32:extra", "123456"}) {
    CAPTURE(bad);
    std::string what;
    try {
      parse_cuda_spec(bad);
    } catch (const core::error& e) {
      what = e.what();
    }
    CHECK(what.find("expected cuda[:index][:tf32]") != std::string::npos);
  }
}
