// IDX data files, normalisation, ordering and partitioning across clients.
#include <doctest/doctest.h>
#include <zlib.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <vector>

#include "../support/error_of.h"
#include "cleave/core/dataset.h"
#include "cleave/core/error.h"
#include "cleave/core/partition.h"

using namespace cleave;
namespace fs = std::filesystem;

namespace {

std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

void write_file(const fs::path& p, const std::string& bytes, bool gz) {
  if (gz) {
    gzFile f = gzopen(p.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(p, std::ios::binary) << bytes;
  }
}

// The folders the tests made, removed when the test program ends.
struct made_dirs {
  std::vector<fs::path> all;
  ~made_dirs() {
    std::error_code ec;
    for (const auto& d : all) fs::remove_all(d, ec);
  }
};
made_dirs& made() {
  static made_dirs m;
  return m;
}

// A tiny IDX data set: n images of 2x3 pixels, labels i % 3.
fs::path make_dir(const std::string& name, int n_train, bool gz) {
  const fs::path dir = fs::temp_directory_path() / ("cleave-test-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  made().all.push_back(dir);
  fs::create_directories(dir);
  for (auto [prefix, n] : {std::pair{"train", n_train}, std::pair{"t10k", 4}}) {
    std::string img = be32(0x803) + be32(static_cast<std::uint32_t>(n)) + be32(2) + be32(3);
    std::string lab = be32(0x801) + be32(static_cast<std::uint32_t>(n));
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < 6; ++j) img.push_back(static_cast<char>((i * 7 + j * 31) % 256));
      lab.push_back(static_cast<char>(i % 3));
    }
    const std::string ext = gz ? ".gz" : "";
    write_file(dir / (std::string(prefix) + "-images-idx3-ubyte" + ext), img, gz);
    write_file(dir / (std::string(prefix) + "-labels-idx1-ubyte" + ext), lab, gz);
  }
  return dir;
}

using cleave::testing::error_of;

}  // namespace

TEST_CASE("IDX files load compressed or not, normalised with the training statistics") {
  for (bool gz : {true, false}) {
    const auto dir = make_dir(gz ? "gz" : "raw", 30, gz);
    const auto d = core::load_dataset(dir.string());
    CHECK(d.train.size() == 30);
    CHECK(d.test.size() == 4);
    CHECK(d.train.item == core::shape{1, 2, 3});
    CHECK(d.train.n_classes == 3);
    CHECK(d.train.y[4] == 1);
    std::vector<float> x(30 * 6);
    std::vector<std::int32_t> y(30);
    std::vector<std::int64_t> all(30);
    for (std::int64_t i = 0; i < 30; ++i) all[static_cast<std::size_t>(i)] = i;
    d.train.gather(all.data(), 30, x.data(), y.data());
    double sum = 0.0;
    for (float v : x) sum += v;
    CHECK(std::fabs(sum / static_cast<double>(x.size())) < 1e-5);
  }
}

// The normalisation as a whole float copy of the training split computes it: pixels scaled to
// [0,1] as float, per-channel mean and deviation summed in double in sample then pixel order.
std::vector<float> normalised_as_floats(const std::vector<std::uint8_t>& nhwc, int n, int hw, int c) {
  std::vector<float> x(static_cast<std::size_t>(n * hw * c));
  for (int s = 0; s < n; ++s)
    for (int ch = 0; ch < c; ++ch)
      for (int j = 0; j < hw; ++j)
        x[static_cast<std::size_t>((s * c + ch) * hw + j)] =
            static_cast<float>(nhwc[static_cast<std::size_t>((s * hw + j) * c + ch)]) * (1.0f / 255.0f);
  for (int ch = 0; ch < c; ++ch) {
    double sum = 0.0, sq = 0.0;
    for (int s = 0; s < n; ++s)
      for (int j = 0; j < hw; ++j) {
        const double v = x[static_cast<std::size_t>((s * c + ch) * hw + j)];
        sum += v;
        sq += v * v;
      }
    const double count = static_cast<double>(n * hw);
    const double mean = sum / count, stdev = std::sqrt(std::max(1e-12, sq / count - mean * mean));
    for (int s = 0; s < n; ++s)
      for (int j = 0; j < hw; ++j) {
        float& v = x[static_cast<std::size_t>((s * c + ch) * hw + j)];
        v = static_cast<float>((v - mean) / stdev);
      }
  }
  return x;
}

TEST_CASE("samples kept as u8 come out exactly as a normalised float copy, channels first, any subset in its order") {
  // 4-dim IDX: (N,H,W,C) with 3 channels of 4x5 pixels.
  constexpr int n = 700, h = 4, w = 5, c = 3, hw = h * w;
  const fs::path dir = fs::temp_directory_path() / ("cleave-test-" + std::to_string(::getpid()) + "-rgb");
  fs::remove_all(dir);
  made().all.push_back(dir);
  fs::create_directories(dir);
  std::vector<std::uint8_t> train_px;
  for (auto [prefix, count] : {std::pair{"train", n}, std::pair{"t10k", 9}}) {
    std::string img = be32(0x804) + be32(count) + be32(h) + be32(w) + be32(c);
    std::string lab = be32(0x801) + be32(count);
    for (int i = 0; i < count * hw * c; ++i) {
      const auto p = static_cast<std::uint8_t>((i * 37 + i / 11) % 251);
      img.push_back(static_cast<char>(p));
      if (prefix == std::string("train")) train_px.push_back(p);
    }
    for (int i = 0; i < count; ++i) lab.push_back(static_cast<char>(i % 4));
    write_file(dir / (std::string(prefix) + "-images-idx3-ubyte.gz"), img, true);
    write_file(dir / (std::string(prefix) + "-labels-idx1-ubyte"), lab, false);
  }
  const auto expected = normalised_as_floats(train_px, n, hw, c);
  constexpr auto per = static_cast<std::size_t>(hw * c);

  const auto whole = core::load_dataset(dir.string());
  REQUIRE(whole.train.size() == n);
  CHECK(whole.train.item == core::shape{c, h, w});
  CHECK(whole.train.pixels.size() == n * per);  // one byte a value
  std::vector<float> x(per);
  std::int32_t y = -1;
  for (std::int64_t i = 0; i < n; ++i) {
    whole.train.gather(&i, 1, x.data(), &y);
    REQUIRE(std::memcmp(x.data(), expected.data() + static_cast<std::size_t>(i) * per, per * 4) == 0);
    REQUIRE(y == i % 4);
  }

  // A shard: only its samples, in the order asked, the same values; no test pixels.
  const std::vector<std::int64_t> keep{699, 3, 512, 0, 513, 3};
  int classes_seen = 0;
  core::load_options o;
  o.test = false;
  o.pick_train = [&](const std::vector<std::int32_t>& labels, int n_classes) {
    CHECK(labels.size() == static_cast<std::size_t>(n));
    classes_seen = n_classes;
    return keep;
  };
  const auto part = core::load_dataset(dir.string(), o);
  CHECK(classes_seen == 4);
  CHECK(part.train.n_classes == 4);
  CHECK(part.test.size() == 0);
  CHECK(part.test.pixels.empty());
  REQUIRE(part.train.size() == static_cast<std::int64_t>(keep.size()));
  CHECK(part.train.pixels.size() == keep.size() * per);
  for (std::int64_t i = 0; i < part.train.size(); ++i) {
    part.train.gather(&i, 1, x.data(), &y);
    const auto src = static_cast<std::size_t>(keep[static_cast<std::size_t>(i)]);
    CHECK(std::memcmp(x.data(), expected.data() + src * per, per * 4) == 0);
    CHECK(y == static_cast<std::int32_t>(src % 4));
  }
  // The test split shares the training split's normalisation.
  const std::int64_t first = 0;
  std::vector<float> t(per);
  whole.test.gather(&first, 1, t.data(), &y);
  const auto sub = whole.test.subset(std::vector<std::int64_t>{0});
  std::vector<float> t2(per);
  sub.gather(&first, 1, t2.data(), &y);
  CHECK(t == t2);
  CHECK(whole.test.table == whole.train.table);

  o.pick_train = [](const std::vector<std::int32_t>&, int) { return std::vector<std::int64_t>{5, 700}; };
  CHECK(error_of([&] { core::load_dataset(dir.string(), o); }).find("sample 700 asked for, it has 700") !=
        std::string::npos);
}

TEST_CASE("a missing data directory or file is a clear error") {
  CHECK(error_of([] { core::load_dataset("/nonexistent/dir"); }).find("data directory '/nonexistent/dir': not found") ==
        0);
  const auto dir = make_dir("missing", 10, false);
  fs::remove(dir / "t10k-labels-idx1-ubyte");
  CHECK(error_of([&] { core::load_dataset(dir.string()); }).find("no t10k-labels-idx1-ubyte") != std::string::npos);
}

TEST_CASE("a node that does not evaluate never reads the test pixels, only the test split's header and labels") {
  const auto dir = make_dir("no-test", 10, false);
  const auto img = dir / "t10k-images-idx3-ubyte";
  fs::resize_file(img, 16 + 6);  // the header and one of the four images
  core::load_options o;
  o.test = false;
  const auto d = core::load_dataset(dir.string(), o);
  CHECK(d.train.size() == 10);
  CHECK(d.test.size() == 0);
  CHECK(error_of([&] { core::load_dataset(dir.string()); }).find("truncated while reading the pixels") !=
        std::string::npos);
  // The header is still checked: the test split must have the training split's shape.
  write_file(img, be32(0x803) + be32(4) + be32(3) + be32(2) + std::string(24, '\0'), false);
  CHECK(error_of([&] { core::load_dataset(dir.string(), o); }).find("differ in shape") != std::string::npos);
}

TEST_CASE("truncated, corrupt and mismatched data files are clear errors") {
  const auto dir = make_dir("bad", 10, false);
  const auto img = dir / "train-images-idx3-ubyte";
  fs::resize_file(img, fs::file_size(img) - 5);
  CHECK(error_of([&] { core::load_dataset(dir.string()); }).find("truncated while reading the pixels") !=
        std::string::npos);

  const auto dir2 = make_dir("magic", 10, false);
  write_file(dir2 / "train-images-idx3-ubyte", be32(0x1234) + std::string(40, '\0'), false);
  CHECK(error_of([&] { core::load_dataset(dir2.string()); }).find("not an IDX u8 image file") != std::string::npos);

  const auto dir3 = make_dir("count", 10, false);
  write_file(dir3 / "train-labels-idx1-ubyte", be32(0x801) + be32(9) + std::string(9, '\1'), false);
  CHECK(error_of([&] { core::load_dataset(dir3.string()); }).find("10 images but 9 labels") != std::string::npos);

  const auto dir4 = make_dir("corrupt", 10, true);
  {
    std::fstream f(dir4 / "train-images-idx3-ubyte.gz", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    f.write("\xff\xff\xff\xff\xff\xff", 6);
  }
  CHECK(error_of([&] { core::load_dataset(dir4.string()); }).find("train-images-idx3-ubyte.gz") != std::string::npos);
}

TEST_CASE("the epoch order is a permutation fixed by seed and epoch") {
  const auto a = core::epoch_order(1000, 7, 0), b = core::epoch_order(1000, 7, 0), c = core::epoch_order(1000, 7, 1);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(std::set<std::int64_t>(a.begin(), a.end()).size() == 1000);
}

namespace {

std::vector<std::int32_t> labels_of(int n, int classes) {
  std::vector<std::int32_t> y(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) y[static_cast<std::size_t>(i)] = (i * 7) % classes;
  return y;
}

void check_is_partition(const std::vector<core::shard>& shards, std::int64_t n) {
  std::set<std::int64_t> seen;
  std::size_t total = 0;
  for (const auto& s : shards) {
    CHECK(!s.empty());
    total += s.size();
    seen.insert(s.begin(), s.end());
  }
  CHECK(total == static_cast<std::size_t>(n));
  CHECK(seen.size() == static_cast<std::size_t>(n));
}

}  // namespace

TEST_CASE("IID partition splits evenly and deterministically") {
  const auto p = core::partition_iid(1003, 4, 1);
  check_is_partition(p, 1003);
  for (const auto& s : p) CHECK((s.size() == 250 || s.size() == 251));
  CHECK(p == core::partition_iid(1003, 4, 1));
  CHECK(p != core::partition_iid(1003, 4, 2));
}

TEST_CASE("Dirichlet partition skews label mixes more as alpha shrinks") {
  const auto y = labels_of(5000, 10);
  auto skew = [&](double alpha) {
    const auto p = core::partition_dirichlet(y, 10, 5, alpha, 3);
    check_is_partition(p, 5000);
    CHECK(p == core::partition_dirichlet(y, 10, 5, alpha, 3));
    // Mean over clients of the largest class share.
    double s = 0.0;
    for (const auto& shard : p) {
      std::vector<int> count(10);
      for (auto i : shard) ++count[static_cast<std::size_t>(y[static_cast<std::size_t>(i)])];
      s += *std::max_element(count.begin(), count.end()) / static_cast<double>(shard.size());
    }
    return s / 5.0;
  };
  CHECK(skew(0.1) > skew(100.0) + 0.2);
  CHECK(skew(100.0) < 0.2);
}

TEST_CASE("k-classes partition gives each client exactly k classes") {
  // 5 clients x 2 classes cover all 10 classes, so every sample is assigned.
  const auto y = labels_of(3000, 10);
  const auto p = core::partition_classes(y, 10, 5, 2, 5);
  check_is_partition(p, 3000);
  for (const auto& s : p) {
    std::set<std::int32_t> classes;
    for (auto i : s) classes.insert(y[static_cast<std::size_t>(i)]);
    CHECK(classes.size() == 2);
  }
}

TEST_CASE("bad partition settings are clear errors") {
  const auto y = labels_of(100, 10);
  CHECK(error_of([&] { core::partition_classes(y, 10, 4, 11, 1); }).find("classes per client must be in [1, 10]") == 0);
  CHECK(error_of([&] { core::partition_dirichlet(y, 10, 4, 0.0, 1); }).find("alpha must be > 0") != std::string::npos);
  CHECK(error_of([&] { core::partition_iid(3, 4, 1); }) == "cannot split 3 samples across 4 clients");
}

TEST_CASE("a shard is picked by partition text, and a bad text or shard names what is wrong") {
  const auto y = labels_of(100, 10);
  const auto all = core::pick_shard("all", y, 10, 4, 3, 1);
  CHECK(all.size() == 100);
  CHECK(core::pick_shard("iid", y, 10, 4, 2, 7) == core::partition_iid(100, 4, 7)[2]);
  CHECK(core::pick_shard("dirichlet:0.5", y, 10, 4, 1, 7) == core::partition_dirichlet(y, 10, 4, 0.5, 7)[1]);
  CHECK(core::pick_shard("classes:2", y, 10, 4, 0, 7) == core::partition_classes(y, 10, 4, 2, 7)[0]);
  CHECK(error_of([&] { core::pick_shard("iid", y, 10, 4, 4, 1); }) == "shard 4 of 4 does not exist");
  CHECK(error_of([&] { core::pick_shard("iid", y, 10, 0, 0, 1); }) == "shard 0 of 0 does not exist");
  CHECK(error_of([&] { core::pick_shard("dirichlet:x", y, 10, 4, 0, 1); }) ==
        "partition 'dirichlet:x': expected dirichlet:ALPHA, e.g. dirichlet:0.5");
  CHECK(error_of([&] { core::pick_shard("classes:", y, 10, 4, 0, 1); }) ==
        "partition 'classes:': expected classes:K, e.g. classes:2");
  CHECK(error_of([&] { core::pick_shard("random", y, 10, 4, 0, 1); }) ==
        "partition 'random': expected iid, dirichlet:ALPHA, classes:K or all");
}
