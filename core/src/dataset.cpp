// IDX reading (through zlib, which also reads uncompressed files), normalisation, ordering.
#include "cleave/core/dataset.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "cleave/core/error.h"
#include "cleave/core/random.h"
#include "dataset_detail.h"

namespace cleave::core {

namespace {

using detail::channel_stats;
using detail::scaled;

struct gz_closer {
  void operator()(gzFile f) const { gzclose(f); }
};
using gz_ptr = std::unique_ptr<gzFile_s, gz_closer>;

class idx_file {
 public:
  explicit idx_file(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    if (!f_) throw error("data file '" + path + "': cannot open (" + std::strerror(errno) + ")");
    gzbuffer(f_.get(), 1 << 18);
  }
  void read(void* dst, std::size_t n, const char* what) {
    std::size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
      const int got = gzread(f_.get(), static_cast<char*>(dst) + done, chunk);
      if (got < 0) {
        int code = 0;
        throw error("data file '" + path_ + "': corrupt (" + gzerror(f_.get(), &code) + ") while reading " + what);
      }
      if (got == 0) throw error("data file '" + path_ + "': truncated while reading " + what);
      done += static_cast<std::size_t>(got);
    }
  }
  std::uint32_t read_be32(const char* what) {
    unsigned char b[4];
    read(b, 4, what);
    return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
  }
  void expect_end() {
    char c;
    const int got = gzread(f_.get(), &c, 1);
    if (got < 0) {
      int code = 0;
      throw error("data file '" + path_ + "': corrupt (" + gzerror(f_.get(), &code) + ")");
    }
    if (got > 0) throw error("data file '" + path_ + "': has trailing bytes after the data");
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  gz_ptr f_;
};

std::string find_file(const std::string& dir, const std::string& base) {
  for (const char* ext : {".gz", ""}) {
    const std::string p = dir + "/" + base + ext;
    if (std::filesystem::exists(p)) return p;
  }
  throw error("data directory '" + dir + "': no " + base + " or " + base + ".gz");
}

// An IDX u8 image file read past its header; the samples follow in file order, (H,W,C) each.
class idx_images {
 public:
  explicit idx_images(const std::string& path) : f_(path) {
    const std::uint32_t magic = f_.read_be32("the header");
    const std::uint32_t n_dims = magic & 0xffu;
    if ((magic >> 8) != 0x08u || (n_dims != 3 && n_dims != 4)) {
      char b[16];
      std::snprintf(b, sizeof b, "%08x", magic);
      throw error("data file '" + path + "': not an IDX u8 image file (magic 0x" + b +
                  ", expected 0x00000803 or 0x00000804)");
    }
    std::uint32_t dims[4] = {0, 0, 0, 1};
    for (std::uint32_t i = 0; i < n_dims; ++i) dims[i] = f_.read_be32("the dimensions");
    n_ = dims[0], h_ = dims[1], w_ = dims[2], c_ = dims[3];
    if (n_ == 0 || h_ == 0 || w_ == 0 || c_ == 0 || h_ > 4096 || w_ > 4096 || c_ > 64 || n_ > (1u << 26) ||
        n_ * h_ * w_ * c_ > (std::uint64_t{1} << 34))
      throw error("data file '" + path + "': implausible dimensions");
  }
  std::uint64_t size() const { return n_; }
  std::uint64_t per_sample() const { return h_ * w_ * c_; }
  shape item() const {
    return shape{static_cast<std::int64_t>(c_), static_cast<std::int64_t>(h_), static_cast<std::int64_t>(w_)};
  }
  const std::string& path() const { return f_.path(); }
  // The next `count` samples into dst as (count,C,H,W): IDX stores (N,H,W[,C]), we keep NCHW.
  void read_nchw(std::uint64_t count, std::uint8_t* dst) {
    if (c_ == 1) return f_.read(dst, count * per_sample(), "the pixels");
    const std::uint64_t hw = h_ * w_;
    scratch_.resize(per_sample());
    for (std::uint64_t s = 0; s < count; ++s, dst += per_sample()) {
      f_.read(scratch_.data(), scratch_.size(), "the pixels");
      for (std::uint64_t ch = 0; ch < c_; ++ch)
        for (std::uint64_t j = 0; j < hw; ++j) dst[ch * hw + j] = scratch_[j * c_ + ch];
    }
  }
  void expect_end() { f_.expect_end(); }

 private:
  idx_file f_;
  std::uint64_t n_ = 0, h_ = 0, w_ = 0, c_ = 1;
  std::vector<std::uint8_t> scratch_;
};

// The labels of `images` from an IDX u8 label file: one per image, at least two classes.
std::vector<std::int32_t> read_labels(const std::string& path, const idx_images& images) {
  idx_file labs(path);
  if (labs.read_be32("the header") != 0x00000801u) throw error("data file '" + path + "': not an IDX u8 label file");
  const std::uint32_t n_labels = labs.read_be32("the dimensions");
  if (n_labels != images.size())
    throw error("data files '" + images.path() + "' and '" + path + "': " + std::to_string(images.size()) +
                " images but " + std::to_string(n_labels) + " labels");
  std::vector<std::uint8_t> raw(n_labels);
  labs.read(raw.data(), raw.size(), "the labels");
  labs.expect_end();
  if (*std::max_element(raw.begin(), raw.end()) < 1) throw error("data file '" + path + "': fewer than two classes");
  return {raw.begin(), raw.end()};
}

int class_count(const std::vector<std::int32_t>& labels) {
  return *std::max_element(labels.begin(), labels.end()) + 1;
}

std::vector<float> scale_table(std::size_t channels) {
  std::vector<float> t(channels * 256);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = scaled(static_cast<std::uint8_t>(i % 256));
  return t;
}

}  // namespace

void dataset::gather(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out) const {
  const auto per = static_cast<std::size_t>(item.numel());
  const auto c = static_cast<std::size_t>(item[0]), hw = per / c;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto s = static_cast<std::size_t>(idx[i]);
    const std::uint8_t* p = pixels.data() + s * per;
    float* x = x_out + static_cast<std::size_t>(i) * per;
    for (std::size_t ch = 0; ch < c; ++ch) {
      const float* t = table.data() + ch * 256;
      for (std::size_t j = 0; j < hw; ++j) x[ch * hw + j] = t[p[ch * hw + j]];
    }
    y_out[i] = y[s];
  }
}

std::map<std::string, std::string> dataset::input_normalisation() const {
  // table[c * 256 + p] = (p / 255 - mean_c) / stdev_c: its ends give both.
  std::string mean = "[", stdev = "[";
  for (std::size_t c = 0; c * 256 < table.size(); ++c) {
    const double lo = table[c * 256], hi = table[c * 256 + 255];
    const double s = 1.0 / (hi - lo);
    mean += fmt::format("{}{:.9g}", c ? "," : "", -lo * s);
    stdev += fmt::format("{}{:.9g}", c ? "," : "", s);
  }
  return {{"input_mean", mean + "]"}, {"input_std", stdev + "]"}};
}

dataset dataset::subset(std::span<const std::int64_t> idx) const {
  dataset d;
  d.name = name;
  d.item = item;
  d.n_classes = n_classes;
  d.table = table;
  const auto per = static_cast<std::size_t>(item.numel());
  d.pixels.resize(idx.size() * per);
  d.y.resize(idx.size());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    const auto s = static_cast<std::size_t>(idx[i]);
    CLEAVE_ASSERT(idx[i] >= 0 && idx[i] < size(), "subset index in range");
    std::memcpy(d.pixels.data() + i * per, pixels.data() + s * per, per);
    d.y[i] = y[s];
  }
  return d;
}

dataset read_idx_pair(const std::string& images_path, const std::string& labels_path) {
  idx_images imgs(images_path);
  dataset d;
  d.y = read_labels(labels_path, imgs);
  d.n_classes = class_count(d.y);
  d.item = imgs.item();
  d.pixels.resize(imgs.size() * imgs.per_sample());
  imgs.read_nchw(imgs.size(), d.pixels.data());
  imgs.expect_end();
  d.table = scale_table(static_cast<std::size_t>(d.item[0]));
  return d;
}

namespace {

dataset_split load_idx(const std::string& name, const std::string& dir, const load_options& o) {
  idx_images train_imgs(find_file(dir, "train-images-idx3-ubyte"));
  auto train_labels = read_labels(find_file(dir, "train-labels-idx1-ubyte"), train_imgs);
  // The test split's header and labels are small and always read: its shape is checked and its
  // labels count towards the classes, so every node sees the same class count.
  idx_images test_imgs(find_file(dir, "t10k-images-idx3-ubyte"));
  auto test_labels = read_labels(find_file(dir, "t10k-labels-idx1-ubyte"), test_imgs);
  if (!(train_imgs.item() == test_imgs.item()))
    throw error("data directory '" + dir + "': train images " + train_imgs.item().str() + " and test images " +
                test_imgs.item().str() + " differ in shape");

  dataset_split s;
  for (dataset* d : {&s.train, &s.test}) {
    d->name = name;
    d->item = train_imgs.item();
    d->n_classes = std::max(class_count(train_labels), class_count(test_labels));
  }
  const auto keep = detail::kept_samples(o, train_labels, s.train.n_classes);
  channel_stats stats(static_cast<std::size_t>(s.train.item[0]));
  s.train.pixels = detail::stream_train(train_imgs, keep, stats, "data file '" + train_imgs.path() + "'");
  s.train.y.resize(keep.size());
  for (std::size_t i = 0; i < keep.size(); ++i) s.train.y[i] = train_labels[static_cast<std::size_t>(keep[i])];
  s.train.table = s.test.table = stats.table();
  if (o.test) {
    s.test.pixels.resize(test_imgs.size() * test_imgs.per_sample());
    test_imgs.read_nchw(test_imgs.size(), s.test.pixels.data());
    test_imgs.expect_end();
    s.test.y = std::move(test_labels);
  }
  return s;
}

enum class layout { idx, cifar10, cifar100 };

// The files by which a directory's layout is recognised.
struct layout_marks {
  layout kind;
  const char* what;
  std::vector<const char*> files;
};

const std::vector<layout_marks>& all_marks() {
  static const std::vector<layout_marks> m{
      {layout::idx,
       "IDX",
       {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
        "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz"}},
      {layout::cifar10,
       "CIFAR-10",
       {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin",
        "test_batch.bin"}},
      {layout::cifar100, "CIFAR-100", {"train.bin", "test.bin"}},
  };
  return m;
}

// The directory holding the data files (`dir` or the CIFAR archive's folder in it) and its layout.
std::pair<std::string, layout> find_layout(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<const layout_marks*, std::string>> seen;  // a layout and one of its files
  for (const auto& m : all_marks())
    for (const char* f : m.files)
      if (fs::exists(dir + "/" + f)) {
        seen.emplace_back(&m, f);
        break;
      }
  if (seen.size() > 1) {
    std::string found;
    for (const auto& [m, f] : seen) found += std::string(found.empty() ? "" : ", ") + m->what + " (" + f + ")";
    throw error("data directory '" + dir + "': holds files of more than one data set layout: " + found +
                "; keep one data set per directory");
  }
  if (seen.size() == 1) return {dir, seen[0].first->kind};
  const char* archives[] = {"cifar-10-batches-bin", "cifar-100-binary"};
  std::vector<std::string> inside;
  for (const char* a : archives)
    if (fs::is_directory(dir + "/" + a)) inside.push_back(dir + "/" + a);
  if (inside.size() > 1)
    throw error("data directory '" + dir + "': holds both cifar-10-batches-bin and cifar-100-binary; give one of them");
  if (inside.size() == 1) {
    const auto [sub, kind] = find_layout(inside[0]);
    if (kind != layout::idx && sub == inside[0]) return {sub, kind};
    throw error("data directory '" + inside[0] + "': no CIFAR binary files in it");
  }
  throw error("data directory '" + dir +
              "': no data files (expected IDX train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
              "t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]; CIFAR-10 data_batch_1.bin .. "
              "data_batch_5.bin and test_batch.bin; or CIFAR-100 train.bin and test.bin)");
}

}  // namespace

dataset_split load_dataset(const std::string& name_or_dir, const load_options& o) {
  const std::string dir = name_or_dir == "fashion-mnist" ? fashion_mnist_dir : name_or_dir;
  if (!std::filesystem::is_directory(dir)) {
    if (name_or_dir == "fashion-mnist")
      throw error(std::string("data set 'fashion-mnist' not found in ") + fashion_mnist_dir +
                  " (install Debian's dataset-fashion-mnist: scripts/setup.sh)");
    throw error("data directory '" + dir +
                "': not found (give 'fashion-mnist' or a directory of IDX or CIFAR binary files)");
  }
  const auto [files, kind] = find_layout(dir);
  switch (kind) {
    case layout::idx:
      return load_idx(name_or_dir, files, o);
    case layout::cifar10:
      return detail::load_cifar(name_or_dir, files, detail::cifar_kind::cifar10, o);
    case layout::cifar100:
      return detail::load_cifar(name_or_dir, files, detail::cifar_kind::cifar100, o);
  }
  CLEAVE_ASSERT(false, "a known layout");
  return {};
}

std::vector<std::int64_t> epoch_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  rng r(mix64(seed ^ 0x5eedda7aULL) ^ mix64(static_cast<std::uint64_t>(epoch)));
  for (std::int64_t i = n - 1; i > 0; --i)
    std::swap(order[static_cast<std::size_t>(i)], order[r.below(static_cast<std::uint64_t>(i + 1))]);
  return order;
}

}  // namespace cleave::core
