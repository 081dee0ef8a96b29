// Checkpoints: round trip, atomic replacement, and clear errors for damaged files.
#include <doctest/doctest.h>

#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "../support/backend_harness.h"
#include "../support/error_of.h"
#include "cleave/core/checkpoint.h"

using namespace cleave;
namespace fs = std::filesystem;

namespace {

using cleave::testing::error_of;

struct fixture {
  std::unique_ptr<core::backend> b = backend::make_backend("reference");
  core::model_spec m = core::zoo_model("resnet8", core::shape{1, 8, 8}, 4);
  core::stage st{*b, m, 0, m.n_blocks(), 3};
  core::optimizer opt{*b, core::optimizer_config{}, st.n_params()};
  fs::path path = fs::temp_directory_path() / ("cleave-test-" + std::to_string(::getpid()) + "-" +
                                               doctest::getContextOptions()->currentTest->m_name + ".ckpt");
  ~fixture() {
    std::error_code ec;
    fs::remove(path, ec);
    fs::remove(path.string() + ".tmp", ec);
  }
};

}  // namespace

TEST_CASE("a checkpoint restores parameters, running statistics and optimizer state") {
  fixture f;
  const auto g = testing::random_vec(f.st.n_params(), 1);
  f.b->upload(f.st.grads(), g.data());
  f.opt.step(f.st.params(), f.st.grads());
  f.b->fill(f.st.buffers(), 0.5f);
  core::save_checkpoint(f.path.string(), core::capture(f.st, f.opt, 3, 7));
  CHECK(!fs::exists(f.path.string() + ".tmp"));

  core::stage st2(*f.b, f.m, 0, f.m.n_blocks(), 99);  // other initial weights
  core::optimizer opt2(*f.b, core::optimizer_config{}, st2.n_params());
  const auto ck = core::load_checkpoint(f.path.string());
  CHECK(ck.epoch == 7);
  core::restore(st2, opt2, ck);
  CHECK(testing::read(*f.b, st2.params()) == testing::read(*f.b, f.st.params()));
  CHECK(testing::read(*f.b, st2.buffers()) == testing::read(*f.b, f.st.buffers()));
  CHECK(testing::read(*f.b, opt2.state()[0]) == testing::read(*f.b, f.opt.state()[0]));
  CHECK(opt2.steps_taken() == 1);
}

TEST_CASE("a checkpoint's text fields come back as written and a checkpoint without them reads as before") {
  fixture f;
  auto ck = core::capture(f.st, f.opt, 3, 7);
  core::save_checkpoint(f.path.string(), ck);
  CHECK(core::load_checkpoint(f.path.string()).meta.empty());
  ck.meta = {{"round", "7"}, {"mode", "splitfed"}, {"empty", ""}};
  core::save_checkpoint(f.path.string(), ck);
  const auto back = core::load_checkpoint(f.path.string());
  CHECK(back.meta == ck.meta);
  REQUIRE(back.find("s:" + f.st.named_buffers().at(0).name) != nullptr);
  CHECK(back.find("no such tensor") == nullptr);
}

TEST_CASE("a truncated or corrupted checkpoint says why it cannot be loaded") {
  fixture f;
  core::save_checkpoint(f.path.string(), core::capture(f.st, f.opt, 3, 1));
  const auto size = fs::file_size(f.path);
  fs::resize_file(f.path, size - 100);
  CHECK(error_of([&] { core::load_checkpoint(f.path.string()); }).find("corrupt or truncated (CRC mismatch)") !=
        std::string::npos);
  { std::ofstream(f.path, std::ios::binary) << "hello, this is not a checkpoint file"; }
  CHECK(error_of([&] { core::load_checkpoint(f.path.string()); }).find("not a cleave checkpoint (bad magic)") !=
        std::string::npos);
  CHECK(error_of([] {
          core::load_checkpoint("/nonexistent.ckpt");
        }).find("checkpoint '/nonexistent.ckpt': cannot open") == 0);
}

TEST_CASE("a checkpoint whose header nests a million levels is refused naming it, not a stack overflow") {
  fixture f;
  const std::string header = "{\"model\":" + std::string(1000000, '[') + std::string(1000000, ']') + "}";
  std::string file("CLVCKPT1", 8);
  const std::uint64_t n = header.size();
  file.append(reinterpret_cast<const char*>(&n), 8);
  file += header;
  const auto crc = static_cast<std::uint32_t>(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(file.data()),
                                                    static_cast<uInt>(file.size())));
  file.append(reinterpret_cast<const char*>(&crc), 4);
  { std::ofstream(f.path, std::ios::binary) << file; }
  const std::string e = error_of([&] { core::load_checkpoint(f.path.string()); });
  CHECK(e.find("checkpoint '" + f.path.string() + "'") == 0);
  CHECK(e.find("header nested deeper than 66 levels") != std::string::npos);
}

TEST_CASE("restoring into another model is refused") {
  fixture f;
  core::save_checkpoint(f.path.string(), core::capture(f.st, f.opt, 3, 1));
  const auto other = core::zoo_model("lenet5", core::shape{1, 28, 28}, 10);
  core::stage st(*f.b, other, 0, other.n_blocks(), 1);
  core::optimizer opt(*f.b, core::optimizer_config{}, st.n_params());
  CHECK(error_of([&] {
          core::restore(st, opt, core::load_checkpoint(f.path.string()));
        }).find("checkpoint is of another model") == 0);
}

TEST_CASE("a failed save leaves the previous checkpoint in place") {
  fixture f;
  core::save_checkpoint(f.path.string(), core::capture(f.st, f.opt, 3, 1));
  const auto before = fs::file_size(f.path);
  CHECK(error_of([&] {
          core::save_checkpoint("/nonexistent-dir/x.ckpt", core::capture(f.st, f.opt, 3, 2));
        }).find("cannot create") != std::string::npos);
  CHECK(fs::file_size(f.path) == before);
}

TEST_CASE("a checkpoint series keeps the previous ones, finds the newest readable one and checks its path") {
  const fs::path dir = fs::temp_directory_path() / ("cleave-series-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "run.ckpt").string();
  const core::checkpoint_series series(path, 2);
  CHECK_NOTHROW(series.check_writable("--checkpoint"));
  CHECK_FALSE(series.newest().newest);
  core::checkpoint c;
  c.model_json = "{}";
  for (std::int64_t epoch = 1; epoch <= 4; ++epoch) {
    c.epoch = epoch;
    REQUIRE(series.save(c) == "");
  }
  // The newest under the path, the two before it kept, nothing older, nothing half-written.
  CHECK(core::load_checkpoint(path).epoch == 4);
  CHECK(core::load_checkpoint(path + ".1").epoch == 3);
  CHECK(core::load_checkpoint(path + ".2").epoch == 2);
  CHECK_FALSE(fs::exists(path + ".3"));
  CHECK_FALSE(fs::exists(path + ".next"));
  CHECK(series.newest().newest->epoch == 4);
  // A torn newest file: the one before it is found, and the torn one is named with why.
  fs::resize_file(path, fs::file_size(path) / 2);
  const auto found = series.newest();
  REQUIRE(found.newest);
  CHECK(found.newest->epoch == 3);
  CHECK(found.from == path + ".1");
  REQUIRE(found.unreadable.size() == 1);
  CHECK(found.unreadable[0].first == path);
  // Paths that cannot be written are refused naming the option.
  CHECK(error_of([&] {
          core::checkpoint_series(dir.string(), 1).check_writable("--out");
        }).find("--out '" + dir.string() + "': is a directory") == 0);
  CHECK(error_of([&] {
          core::checkpoint_series((dir / "no" / "x").string(), 1).check_writable("--out");
        }).find("does not exist") != std::string::npos);
  fs::remove_all(dir);
}
