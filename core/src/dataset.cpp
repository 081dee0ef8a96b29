// IDX reading (through zlib, which also reads uncompressed files), normalisation, ordering.
#include "cleave/core/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "cleave/core/error.h"
#include "cleave/core/random.h"

namespace cleave::core {

namespace {

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

float scaled(std::uint8_t p) {
  return static_cast<float>(p) * (1.0f / 255.0f);
}

// Sums of the scaled pixel values per channel, in sample then pixel order.
struct channel_stats {
  std::vector<double> sum, sq;
  std::uint64_t n_per_channel = 0;

  explicit channel_stats(std::size_t c) : sum(c), sq(c) {}
  // samples (n,C,H*W)
  void add(const std::uint8_t* samples, std::uint64_t n, std::uint64_t hw) {
    const std::size_t c = sum.size();
    for (std::uint64_t s = 0; s < n; ++s)
      for (std::size_t ch = 0; ch < c; ++ch) {
        const std::uint8_t* p = samples + (s * c + ch) * hw;
        double& su = sum[ch];
        double& q = sq[ch];
        for (std::uint64_t j = 0; j < hw; ++j) {
          const double v = scaled(p[j]);
          su += v;
          q += v * v;
        }
      }
    n_per_channel += n * hw;
  }
  // table[c * 256 + p] = (p / 255 - mean_c) / stdev_c
  std::vector<float> table() const {
    std::vector<float> t(sum.size() * 256);
    const auto count = static_cast<double>(n_per_channel);
    for (std::size_t ch = 0; ch < sum.size(); ++ch) {
      const double mean = sum[ch] / count;
      const double stdev = std::sqrt(std::max(1e-12, sq[ch] / count - mean * mean));
      for (int p = 0; p < 256; ++p)
        t[ch * 256 + static_cast<std::size_t>(p)] =
            static_cast<float>((static_cast<double>(scaled(static_cast<std::uint8_t>(p))) - mean) / stdev);
    }
    return t;
  }
};

std::vector<float> scale_table(std::size_t channels) {
  std::vector<float> t(channels * 256);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = scaled(static_cast<std::uint8_t>(i % 256));
  return t;
}

// Streams the training images: statistics of all of them, pixels of the samples `keep` (in
// that order) only.
std::vector<std::uint8_t> stream_train(idx_images& imgs, const std::vector<std::int64_t>& keep, channel_stats& stats) {
  const std::uint64_t per = imgs.per_sample(), n = imgs.size();
  // (source sample, position in the kept set), by source.
  std::vector<std::pair<std::int64_t, std::int64_t>> wanted(keep.size());
  for (std::size_t i = 0; i < keep.size(); ++i) {
    if (keep[i] < 0 || static_cast<std::uint64_t>(keep[i]) >= n)
      throw error("data file '" + imgs.path() + "': sample " + std::to_string(keep[i]) + " asked for, it has " +
                  std::to_string(n));
    wanted[i] = {keep[i], static_cast<std::int64_t>(i)};
  }
  std::sort(wanted.begin(), wanted.end());
  std::vector<std::uint8_t> out(keep.size() * per);
  constexpr std::uint64_t chunk = 512;
  std::vector<std::uint8_t> buf(chunk * per);
  auto next = wanted.begin();
  for (std::uint64_t first = 0; first < n; first += chunk) {
    const std::uint64_t count = std::min(chunk, n - first);
    imgs.read_nchw(count, buf.data());
    stats.add(buf.data(), count, per / stats.sum.size());
    for (; next != wanted.end() && static_cast<std::uint64_t>(next->first) < first + count; ++next)
      std::memcpy(out.data() + static_cast<std::uint64_t>(next->second) * per,
                  buf.data() + (static_cast<std::uint64_t>(next->first) - first) * per, per);
  }
  imgs.expect_end();
  return out;
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

dataset dataset::subset(std::span<const std::int64_t> idx) const {
  dataset d{name, item, n_classes, {}, {}, table};
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

dataset_split load_dataset(const std::string& name_or_dir, const load_options& o) {
  const std::string dir = name_or_dir == "fashion-mnist" ? fashion_mnist_dir : name_or_dir;
  if (!std::filesystem::is_directory(dir)) {
    if (name_or_dir == "fashion-mnist")
      throw error(std::string("data set 'fashion-mnist' not found in ") + fashion_mnist_dir +
                  " (install Debian's dataset-fashion-mnist: scripts/setup.sh)");
    throw error("data directory '" + dir + "': not found (give 'fashion-mnist' or a directory of IDX files)");
  }
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
    d->name = name_or_dir;
    d->item = train_imgs.item();
    d->n_classes = std::max(class_count(train_labels), class_count(test_labels));
  }
  std::vector<std::int64_t> keep;
  if (o.pick_train) {
    keep = o.pick_train(train_labels, s.train.n_classes);
  } else {
    keep.resize(train_labels.size());
    for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = static_cast<std::int64_t>(i);
  }
  channel_stats stats(static_cast<std::size_t>(s.train.item[0]));
  s.train.pixels = stream_train(train_imgs, keep, stats);
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

std::vector<std::int64_t> epoch_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  rng r(mix64(seed ^ 0x5eedda7aULL) ^ mix64(static_cast<std::uint64_t>(epoch)));
  for (std::int64_t i = n - 1; i > 0; --i)
    std::swap(order[static_cast<std::size_t>(i)], order[r.below(static_cast<std::uint64_t>(i + 1))]);
  return order;
}

}  // namespace cleave::core
