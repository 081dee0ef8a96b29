// CIFAR-10 and CIFAR-100 binary directories, and the seeded augmentation of drawn batches.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include "../support/cifar_files.h"
#include "../support/error_of.h"
#include "cleave/core/dataset.h"

using namespace cleave;
namespace fs = std::filesystem;
using cleave::testing::cifar_pixel;
using cleave::testing::cifar_records;
using cleave::testing::cifar_temp_dir;
using cleave::testing::error_of;
using cleave::testing::write_bytes;
using cleave::testing::write_cifar10;
using cleave::testing::write_cifar100;

namespace {

constexpr std::size_t per = 3072, hw = 1024;

std::vector<std::int64_t> iota(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

// The training split normalised as a whole float copy would be: pixels scaled to [0,1] as
// float, per-channel mean and deviation summed in double in sample then pixel order.
std::vector<float> normalised_train(int n) {
  std::vector<float> x(static_cast<std::size_t>(n) * per);
  for (int s = 0; s < n; ++s)
    for (std::size_t j = 0; j < per; ++j)
      x[static_cast<std::size_t>(s) * per + j] =
          static_cast<float>(cifar_pixel(0, s, static_cast<int>(j))) * (1.0f / 255.0f);
  for (std::size_t ch = 0; ch < 3; ++ch) {
    double sum = 0.0, sq = 0.0;
    for (int s = 0; s < n; ++s)
      for (std::size_t j = 0; j < hw; ++j) {
        const double v = x[static_cast<std::size_t>(s) * per + ch * hw + j];
        sum += v;
        sq += v * v;
      }
    const double count = static_cast<double>(n) * hw;
    const double mean = sum / count, stdev = std::sqrt(std::max(1e-12, sq / count - mean * mean));
    for (int s = 0; s < n; ++s)
      for (std::size_t j = 0; j < hw; ++j) {
        float& v = x[static_cast<std::size_t>(s) * per + ch * hw + j];
        v = static_cast<float>((v - mean) / stdev);
      }
  }
  return x;
}

// Per-channel mean and standard deviation of n drawn samples x (n,3,32,32).
void check_standardised(const std::vector<float>& x, std::size_t n) {
  for (std::size_t ch = 0; ch < 3; ++ch) {
    double sum = 0.0, sq = 0.0;
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t j = 0; j < hw; ++j) {
        const double v = x[s * per + ch * hw + j];
        sum += v;
        sq += v * v;
      }
    const double count = static_cast<double>(n * hw), mean = sum / count;
    CHECK(std::fabs(mean) < 1e-5);
    CHECK(std::fabs(std::sqrt(sq / count - mean * mean) - 1.0) < 1e-4);
  }
}

// The whole training split drawn in order.
std::vector<float> draw_all(const core::dataset& d, std::vector<std::int32_t>& y) {
  const auto idx = iota(d.size());
  std::vector<float> x(idx.size() * per);
  y.assign(idx.size(), -1);
  d.gather(idx.data(), d.size(), x.data(), y.data());
  return x;
}

}  // namespace

TEST_CASE("CIFAR-10 batches load in order as 3x32x32 images of 10 classes normalised per channel") {
  const auto dir = cifar_temp_dir("c10");
  write_cifar10(dir, {3, 2, 4, 1, 2}, 5);
  const auto d = core::load_dataset(dir.string());
  CHECK(d.train.name == dir.string());
  CHECK(d.train.item == core::shape{3, 32, 32});
  CHECK(d.test.item == core::shape{3, 32, 32});
  CHECK(d.train.n_classes == 10);  // whatever labels the few records hold
  CHECK(d.test.n_classes == 10);
  REQUIRE(d.train.size() == 12);
  REQUIRE(d.test.size() == 5);
  CHECK(d.train.pixels.size() == 12 * per);  // one byte a value
  std::vector<std::int32_t> y;
  const auto x = draw_all(d.train, y);
  for (int s = 0; s < 12; ++s) CHECK(y[static_cast<std::size_t>(s)] == (s * 3) % 10);
  const auto expected = normalised_train(12);
  CHECK(std::memcmp(x.data(), expected.data(), x.size() * sizeof(float)) == 0);
  check_standardised(x, 12);
  // The test split: its own pixels, the training split's normalisation.
  CHECK(d.test.table == d.train.table);
  CHECK(d.test.pixels[5] == cifar_pixel(1, 0, 5));
  CHECK(d.test.pixels[4 * per + 2000] == cifar_pixel(1, 4, 2000));
  for (int s = 0; s < 5; ++s) CHECK(d.test.y[static_cast<std::size_t>(s)] == (s * 3) % 10);
}

TEST_CASE("CIFAR-100 files load with their fine labels as 100 classes") {
  const auto dir = cifar_temp_dir("c100");
  write_cifar100(dir, 9, 4);
  const auto d = core::load_dataset(dir.string());
  CHECK(d.train.item == core::shape{3, 32, 32});
  CHECK(d.train.n_classes == 100);
  CHECK(d.test.n_classes == 100);
  REQUIRE(d.train.size() == 9);
  REQUIRE(d.test.size() == 4);
  std::vector<std::int32_t> y;
  const auto x = draw_all(d.train, y);
  for (int s = 0; s < 9; ++s) CHECK(y[static_cast<std::size_t>(s)] == (s * 7) % 100);
  for (int s = 0; s < 4; ++s) CHECK(d.test.y[static_cast<std::size_t>(s)] == (s * 7) % 100);
  const auto expected = normalised_train(9);
  CHECK(std::memcmp(x.data(), expected.data(), x.size() * sizeof(float)) == 0);
  check_standardised(x, 9);
  CHECK(d.test.pixels[3 * per + 77] == cifar_pixel(1, 3, 77));
}

TEST_CASE("the folder an official CIFAR archive unpacks to is read from the directory holding it") {
  const auto top10 = cifar_temp_dir("archive10");
  fs::create_directories(top10 / "cifar-10-batches-bin");
  write_cifar10(top10 / "cifar-10-batches-bin", {1, 1, 1, 1, 2}, 2);
  const auto d10 = core::load_dataset(top10.string());
  CHECK(d10.train.size() == 6);
  CHECK(d10.train.n_classes == 10);

  const auto top100 = cifar_temp_dir("archive100");
  fs::create_directories(top100 / "cifar-100-binary");
  write_cifar100(top100 / "cifar-100-binary", 5, 2);
  const auto d100 = core::load_dataset(top100.string());
  CHECK(d100.train.size() == 5);
  CHECK(d100.train.n_classes == 100);

  // Both archives side by side: which one is meant is not guessed.
  fs::create_directories(top10 / "cifar-100-binary");
  write_cifar100(top10 / "cifar-100-binary", 5, 2);
  CHECK(error_of([&] { core::load_dataset(top10.string()); }) ==
        "data directory '" + top10.string() +
            "': holds both cifar-10-batches-bin and cifar-100-binary; give one of them");
  // An archive folder without its files.
  const auto hollow = cifar_temp_dir("hollow");
  fs::create_directories(hollow / "cifar-10-batches-bin");
  CHECK(error_of([&] {
          core::load_dataset(hollow.string());
        }).find("data directory '" + (hollow / "cifar-10-batches-bin").string() + "': no data files") == 0);
}

TEST_CASE("a CIFAR training shard is streamed: only the kept samples stay, in the order asked") {
  const auto dir = cifar_temp_dir("shard");
  write_cifar10(dir, {3, 2, 4, 1, 2}, 5);
  const std::vector<std::int64_t> keep{11, 2, 3, 0, 9, 3};
  int classes_seen = 0;
  std::vector<std::int32_t> labels_seen;
  core::load_options o;
  o.test = false;
  o.pick_train = [&](const std::vector<std::int32_t>& labels, int n_classes) {
    labels_seen = labels;
    classes_seen = n_classes;
    return keep;
  };
  const auto part = core::load_dataset(dir.string(), o);
  CHECK(classes_seen == 10);
  REQUIRE(labels_seen.size() == 12);  // every training label, across the batches
  for (int s = 0; s < 12; ++s) CHECK(labels_seen[static_cast<std::size_t>(s)] == (s * 3) % 10);
  CHECK(part.test.size() == 0);
  CHECK(part.test.pixels.empty());
  REQUIRE(part.train.size() == static_cast<std::int64_t>(keep.size()));
  CHECK(part.train.pixels.size() == keep.size() * per);
  // The same values as the whole split's: the statistics are of all of it.
  const auto expected = normalised_train(12);
  std::vector<float> x(per);
  std::int32_t y = -1;
  for (std::int64_t i = 0; i < part.train.size(); ++i) {
    part.train.gather(&i, 1, x.data(), &y);
    const auto src = static_cast<std::size_t>(keep[static_cast<std::size_t>(i)]);
    CHECK(std::memcmp(x.data(), expected.data() + src * per, per * sizeof(float)) == 0);
    CHECK(y == static_cast<std::int32_t>((src * 3) % 10));
  }
  o.pick_train = [](const std::vector<std::int32_t>&, int) { return std::vector<std::int64_t>{5, 12}; };
  CHECK(error_of([&] { core::load_dataset(dir.string(), o); }) ==
        "data directory '" + dir.string() + "': sample 12 asked for, it has 12");
}

TEST_CASE("bad CIFAR files are errors that name the file and what is wrong") {
  SUBCASE("a file size that is not a whole number of records") {
    const auto dir = cifar_temp_dir("size");
    write_cifar10(dir, {2, 2, 2, 2, 2}, 2);
    const auto f = dir / "data_batch_3.bin";
    write_bytes(f, cifar_records(false, 0, 0, 2) + "xyz");
    CHECK(error_of([&] { core::load_dataset(dir.string()); }) ==
          "data file '" + f.string() + "': 6149 bytes, not a whole number of 3073-byte CIFAR-10 records");
    const auto dir100 = cifar_temp_dir("size100");
    write_cifar100(dir100, 3, 2);
    const auto t = dir100 / "test.bin";
    write_bytes(t, cifar_records(false, 1, 0, 2));  // CIFAR-10 records under a CIFAR-100 name
    CHECK(error_of([&] { core::load_dataset(dir100.string()); }) ==
          "data file '" + t.string() + "': 6146 bytes, not a whole number of 3074-byte CIFAR-100 records");
  }
  SUBCASE("an empty file") {
    const auto dir = cifar_temp_dir("empty");
    write_cifar10(dir, {2, 2, 2, 2, 2}, 2);
    write_bytes(dir / "test_batch.bin", "");
    CHECK(error_of([&] { core::load_dataset(dir.string()); }) ==
          "data file '" + (dir / "test_batch.bin").string() + "': empty (no CIFAR-10 records)");
  }
  SUBCASE("a label out of range") {
    const auto dir = cifar_temp_dir("label");
    write_cifar10(dir, {2, 2, 2, 2, 2}, 2);
    auto rec = cifar_records(false, 0, 0, 2);
    rec[3073] = 10;
    write_bytes(dir / "data_batch_4.bin", rec);
    CHECK(error_of([&] { core::load_dataset(dir.string()); }) ==
          "data file '" + (dir / "data_batch_4.bin").string() +
              "': record 1 has label 10, out of range for CIFAR-10's 10 classes");
    const auto dir100 = cifar_temp_dir("label100");
    write_cifar100(dir100, 3, 2);
    auto r100 = cifar_records(true, 0, 0, 3);
    r100[2 * 3074 + 1] = static_cast<char>(100);
    write_bytes(dir100 / "train.bin", r100);
    CHECK(error_of([&] { core::load_dataset(dir100.string()); }) ==
          "data file '" + (dir100 / "train.bin").string() +
              "': record 2 has label 100, out of range for CIFAR-100's 100 classes");
    r100[2 * 3074 + 1] = 5;
    r100[3074] = 20;
    write_bytes(dir100 / "train.bin", r100);
    CHECK(error_of([&] { core::load_dataset(dir100.string()); }) ==
          "data file '" + (dir100 / "train.bin").string() +
              "': record 1 has coarse label 20, out of range for CIFAR-100's 20 superclasses");
  }
  SUBCASE("a missing batch") {
    const auto dir = cifar_temp_dir("missing");
    write_cifar10(dir, {2, 2, 2, 2, 2}, 2);
    fs::remove(dir / "data_batch_5.bin");
    CHECK(error_of([&] { core::load_dataset(dir.string()); }) ==
          "data directory '" + dir.string() +
              "': no data_batch_5.bin (CIFAR-10 needs data_batch_1.bin, data_batch_2.bin, data_batch_3.bin, "
              "data_batch_4.bin, data_batch_5.bin, test_batch.bin)");
    const auto dir100 = cifar_temp_dir("missing100");
    write_bytes(dir100 / "train.bin", cifar_records(true, 0, 0, 2));
    CHECK(error_of([&] { core::load_dataset(dir100.string()); }) ==
          "data directory '" + dir100.string() + "': no test.bin (CIFAR-100 needs train.bin, test.bin)");
  }
  SUBCASE("mixed layouts") {
    const auto dir = cifar_temp_dir("mixed");
    write_cifar10(dir, {2, 2, 2, 2, 2}, 2);
    write_cifar100(dir, 2, 2);
    CHECK(error_of([&] { core::load_dataset(dir.string()); }) ==
          "data directory '" + dir.string() +
              "': holds files of more than one data set layout: CIFAR-10 (data_batch_1.bin), CIFAR-100 "
              "(train.bin); keep one data set per directory");
    const auto idx = cifar_temp_dir("mixed-idx");
    write_cifar100(idx, 2, 2);
    write_bytes(idx / "t10k-labels-idx1-ubyte.gz", "");
    CHECK(error_of([&] { core::load_dataset(idx.string()); }) ==
          "data directory '" + idx.string() +
              "': holds files of more than one data set layout: IDX (t10k-labels-idx1-ubyte.gz), CIFAR-100 "
              "(train.bin); keep one data set per directory");
  }
  SUBCASE("no data files at all") {
    const auto dir = cifar_temp_dir("none");
    CHECK(error_of([&] {
            core::load_dataset(dir.string());
          }).find("data directory '" + dir.string() + "': no data files (expected IDX") == 0);
  }
}

// --- augmentation ---

namespace {

core::dataset small_cifar(const std::string& name, int n) {
  const auto dir = cifar_temp_dir(name);
  write_cifar10(dir, {n, 1, 1, 1, 1}, 1);
  return core::load_dataset(dir.string()).train;
}

// One sample drawn alone, augmented or not.
std::vector<float> draw(const core::dataset& d, std::int64_t i, const core::augment_config& a = {},
                        std::uint64_t seed = 0, std::int64_t epoch = 0) {
  std::vector<float> x(per);
  std::int32_t y = -1;
  d.gather(&i, 1, x.data(), &y, a, seed, epoch);
  CHECK(y == d.y[static_cast<std::size_t>(i)]);
  return x;
}

const core::augment_config crop_flip{true, 4, true}, crop_only{true, 4, false}, flip_only{false, 4, true};

}  // namespace

TEST_CASE("without augmentation a drawn batch is exactly what gather gives") {
  const auto d = small_cifar("plain", 8);
  const std::vector<std::int64_t> idx{3, 0, 7, 7, 11};
  std::vector<float> a(idx.size() * per), b(idx.size() * per);
  std::vector<std::int32_t> ya(idx.size()), yb(idx.size());
  d.gather(idx.data(), 5, a.data(), ya.data());
  d.gather(idx.data(), 5, b.data(), yb.data(), core::augment_config{}, 99, 3);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  CHECK(ya == yb);
}

TEST_CASE("the augmentation of a sample is fixed by seed, epoch and sample, whatever batch it is drawn in") {
  const auto d = small_cifar("batch", 40);
  const auto idx = iota(d.size());
  std::vector<float> whole(idx.size() * per);
  std::vector<std::int32_t> y(idx.size());
  d.gather(idx.data(), d.size(), whole.data(), y.data(), crop_flip, 5, 2);
  // Alone, in another order, or twice in one batch: the same values.
  const std::vector<std::int64_t> other{17, 3, 17, 40, 0};
  std::vector<float> part(other.size() * per);
  std::vector<std::int32_t> yp(other.size());
  d.gather(other.data(), 5, part.data(), yp.data(), crop_flip, 5, 2);
  for (std::size_t i = 0; i < other.size(); ++i) {
    const auto s = static_cast<std::size_t>(other[i]);
    CHECK(std::memcmp(part.data() + i * per, whole.data() + s * per, per * sizeof(float)) == 0);
    CHECK(draw(d, other[i], crop_flip, 5, 2) ==
          std::vector<float>(whole.begin() + static_cast<std::ptrdiff_t>(s * per),
                             whole.begin() + static_cast<std::ptrdiff_t>((s + 1) * per)));
    CHECK(yp[i] == y[s]);
  }
  // Another epoch or seed draws other crops and flips for some samples.
  int differ_epoch = 0, differ_seed = 0;
  for (std::int64_t s = 0; s < d.size(); ++s) {
    const auto a = core::draw_augment(crop_flip, 5, 2, s), b = core::draw_augment(crop_flip, 5, 3, s),
               c = core::draw_augment(crop_flip, 6, 2, s);
    differ_epoch += a.dx != b.dx || a.dy != b.dy || a.flip != b.flip;
    differ_seed += a.dx != c.dx || a.dy != c.dy || a.flip != c.flip;
  }
  CHECK(differ_epoch > 30);
  CHECK(differ_seed > 30);
}

TEST_CASE("augmentation draws are the fixed values of a counter-based hash, spread over every choice") {
  // Fixed across machines, builds and releases: a run's augmentation is reproducible anywhere.
  struct pinned {
    std::uint64_t seed;
    std::int64_t epoch, sample;
    int dy, dx;
    bool flip;
  };
  for (const pinned& p : {pinned{1, 0, 0, 3, 7, false}, pinned{1, 0, 1, 7, 1, false}, pinned{1, 0, 3, 7, 7, false},
                          pinned{12345, 7, 49999, 3, 7, true}}) {
    const auto d = core::draw_augment(crop_flip, p.seed, p.epoch, p.sample);
    CHECK(d.dy == p.dy);
    CHECK(d.dx == p.dx);
    CHECK(d.flip == p.flip);
  }
  std::set<int> dys, dxs;
  int flips = 0;
  for (std::int64_t s = 0; s < 2000; ++s) {
    const auto d = core::draw_augment(crop_flip, 1, 0, s);
    dys.insert(d.dy);
    dxs.insert(d.dx);
    flips += d.flip;
    // Each of crop and flip keeps its draws when the other is off.
    const auto c = core::draw_augment(crop_only, 1, 0, s), f = core::draw_augment(flip_only, 1, 0, s);
    CHECK(c.dx == d.dx);
    CHECK(c.dy == d.dy);
    CHECK(!c.flip);
    CHECK(f.flip == d.flip);
    CHECK(f.dx == 0);
    CHECK(f.dy == 0);
  }
  CHECK(dys == std::set<int>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(dxs == std::set<int>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(flips > 900);
  CHECK(flips < 1100);
}

TEST_CASE("a flipped sample is the plain sample mirrored left to right") {
  const auto d = small_cifar("flip", 16);
  int flipped = 0;
  for (std::int64_t s = 0; s < d.size(); ++s) {
    const auto plain = draw(d, s), aug = draw(d, s, flip_only, 7, 1);
    const bool flip = core::draw_augment(flip_only, 7, 1, s).flip;
    flipped += flip;
    for (std::size_t ch = 0; ch < 3; ++ch)
      for (std::size_t r = 0; r < 32; ++r)
        for (std::size_t c = 0; c < 32; ++c)
          REQUIRE(aug[ch * hw + r * 32 + c] == plain[ch * hw + r * 32 + (flip ? 31 - c : c)]);
  }
  CHECK(flipped > 0);
  CHECK(flipped < 16);
}

TEST_CASE("a crop shifts the image and shows the padding as the normalised value of a 0 pixel") {
  const auto d = small_cifar("crop", 24);
  int shifted = 0;
  for (const auto& a : {crop_only, crop_flip, core::augment_config{true, 9, false}}) {
    for (std::int64_t s = 0; s < d.size(); ++s) {
      const auto plain = draw(d, s), aug = draw(d, s, a, 3, 4);
      const auto dr = core::draw_augment(a, 3, 4, s);
      REQUIRE(dr.dy >= 0);
      REQUIRE(dr.dy <= 2 * a.pad);
      REQUIRE(dr.dx >= 0);
      REQUIRE(dr.dx <= 2 * a.pad);
      const int oy = dr.dy - a.pad, ox = dr.dx - a.pad;
      shifted += oy != 0 || ox != 0;
      for (int ch = 0; ch < 3; ++ch) {
        const float zero = d.table[static_cast<std::size_t>(ch) * 256];
        for (int r = 0; r < 32; ++r)
          for (int c = 0; c < 32; ++c) {
            const int sr = r + oy, sc = (dr.flip ? 31 - c : c) + ox;
            const bool inside = sr >= 0 && sr < 32 && sc >= 0 && sc < 32;
            const float want = inside ? plain[static_cast<std::size_t>(ch * 1024 + sr * 32 + sc)] : zero;
            REQUIRE(aug[static_cast<std::size_t>(ch * 1024 + r * 32 + c)] == want);
          }
      }
    }
  }
  CHECK(shifted > 40);
  // A 0 pixel's normalised value is below every channel's mean: the padding is not 0.
  CHECK(d.table[0] < 0.0f);
}

TEST_CASE("augment text reads as crop and flip settings, and bad text is an error naming it") {
  const auto both = core::parse_augment("crop,flip");
  CHECK(both.crop);
  CHECK(both.flip);
  CHECK(both.pad == 4);
  CHECK(core::augment_str(both) == "crop:4,flip");
  const auto c8 = core::parse_augment("flip,crop:8");
  CHECK(c8.crop);
  CHECK(c8.pad == 8);
  CHECK(c8.flip);
  CHECK(core::augment_str(core::parse_augment("crop")) == "crop:4");
  CHECK(core::augment_str(core::parse_augment("flip")) == "flip");
  CHECK(!core::parse_augment("none").any());
  CHECK(core::augment_str(core::augment_config{}) == "none");
  for (const char* bad : {"", "crop,", "rotate", "crop:", "crop:x", "crop8", "flip,flip", "crop:4:4"})
    CHECK(error_of([&] { core::parse_augment(bad); }) ==
          std::string("augment '") + bad +
              "': expected crop, crop:PAD, flip or both separated by ',' (e.g. crop,flip), or none");
  CHECK(error_of([] { core::parse_augment("crop:0"); }) ==
        "augment 'crop:0': crop padding must be in [1, 1024], got 0");
}
