// IDX reading (through zlib, which also reads uncompressed files), normalisation, ordering.
#include "cleave/core/dataset.h"

#include <zlib.h>

#include <cmath>
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

}  // namespace

void dataset::gather(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out) const {
  const std::size_t per = static_cast<std::size_t>(item.numel());
  for (std::int64_t i = 0; i < n; ++i) {
    const auto s = static_cast<std::size_t>(idx[i]);
    std::memcpy(x_out + static_cast<std::size_t>(i) * per, x.data() + s * per, per * sizeof(float));
    y_out[i] = y[s];
  }
}

dataset read_idx_pair(const std::string& images_path, const std::string& labels_path) {
  idx_file imgs(images_path);
  const std::uint32_t magic = imgs.read_be32("the header");
  const std::uint32_t n_dims = magic & 0xffu;
  if ((magic >> 8) != 0x08u || (n_dims != 3 && n_dims != 4))
    throw error("data file '" + images_path + "': not an IDX u8 image file (magic 0x" + [&] {
      char b[16];
      std::snprintf(b, sizeof b, "%08x", magic);
      return std::string(b);
    }() + ", expected 0x00000803 or 0x00000804)");
  std::uint32_t dims[4] = {0, 0, 0, 1};
  for (std::uint32_t i = 0; i < n_dims; ++i) dims[i] = imgs.read_be32("the dimensions");
  // IDX stores (N,H,W) or (N,H,W,C); we keep NCHW.
  const std::uint64_t n = dims[0], h = dims[1], w = dims[2], c = n_dims == 4 ? dims[3] : 1;
  if (n == 0 || h == 0 || w == 0 || c == 0 || h > 4096 || w > 4096 || c > 64 || n > (1u << 26) ||
      n * h * w * c > (std::uint64_t{1} << 34))
    throw error("data file '" + images_path + "': implausible dimensions");

  idx_file labs(labels_path);
  const std::uint32_t lmagic = labs.read_be32("the header");
  if (lmagic != 0x00000801u) throw error("data file '" + labels_path + "': not an IDX u8 label file");
  const std::uint32_t n_labels = labs.read_be32("the dimensions");
  if (n_labels != n)
    throw error("data files '" + images_path + "' and '" + labels_path + "': " + std::to_string(n) + " images but " +
                std::to_string(n_labels) + " labels");

  dataset d;
  d.item = shape{static_cast<std::int64_t>(c), static_cast<std::int64_t>(h), static_cast<std::int64_t>(w)};
  std::vector<std::uint8_t> raw(n * h * w * c);
  imgs.read(raw.data(), raw.size(), "the pixels");
  imgs.expect_end();
  std::vector<std::uint8_t> lraw(n);
  labs.read(lraw.data(), lraw.size(), "the labels");
  labs.expect_end();

  d.x.resize(raw.size());
  const std::size_t hw = h * w;
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t ch = 0; ch < c; ++ch)
      for (std::size_t j = 0; j < hw; ++j)
        d.x[(s * c + ch) * hw + j] = static_cast<float>(raw[(s * hw + j) * c + ch]) * (1.0f / 255.0f);
  d.y.assign(lraw.begin(), lraw.end());
  int max_label = 0;
  for (auto v : d.y) max_label = std::max(max_label, static_cast<int>(v));
  d.n_classes = max_label + 1;
  if (d.n_classes < 2) throw error("data file '" + labels_path + "': fewer than two classes");
  return d;
}

dataset_split load_dataset(const std::string& name_or_dir) {
  const std::string dir = name_or_dir == "fashion-mnist" ? fashion_mnist_dir : name_or_dir;
  if (!std::filesystem::is_directory(dir)) {
    if (name_or_dir == "fashion-mnist")
      throw error(std::string("data set 'fashion-mnist' not found in ") + fashion_mnist_dir +
                  " (install Debian's dataset-fashion-mnist: scripts/setup.sh)");
    throw error("data directory '" + dir + "': not found (give 'fashion-mnist' or a directory of IDX files)");
  }
  dataset_split s;
  s.train = read_idx_pair(find_file(dir, "train-images-idx3-ubyte"), find_file(dir, "train-labels-idx1-ubyte"));
  s.test = read_idx_pair(find_file(dir, "t10k-images-idx3-ubyte"), find_file(dir, "t10k-labels-idx1-ubyte"));
  if (!(s.train.item == s.test.item))
    throw error("data directory '" + dir + "': train images " + s.train.item.str() + " and test images " +
                s.test.item.str() + " differ in shape");
  const int classes = std::max(s.train.n_classes, s.test.n_classes);
  s.train.n_classes = s.test.n_classes = classes;
  s.train.name = s.test.name = name_or_dir;

  // Per-channel normalisation with the training set's statistics.
  const auto c = static_cast<std::size_t>(s.train.item[0]);
  const auto hw = static_cast<std::size_t>(s.train.item[1] * s.train.item[2]);
  for (std::size_t ch = 0; ch < c; ++ch) {
    double sum = 0.0, sq = 0.0;
    const auto n = static_cast<std::size_t>(s.train.size());
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < hw; ++j) {
        const double v = s.train.x[(i * c + ch) * hw + j];
        sum += v;
        sq += v * v;
      }
    const double count = static_cast<double>(n * hw);
    const double mean = sum / count;
    const double stdev = std::sqrt(std::max(1e-12, sq / count - mean * mean));
    for (dataset* d : {&s.train, &s.test})
      for (std::size_t i = 0; i < static_cast<std::size_t>(d->size()); ++i)
        for (std::size_t j = 0; j < hw; ++j) {
          float& v = d->x[(i * c + ch) * hw + j];
          v = static_cast<float>((v - mean) / stdev);
        }
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
