// CIFAR-10 and CIFAR-100 binary files: fixed-size records of label bytes and (3,32,32) pixels,
// checked whole before use and read in two passes (labels, then the kept pixels).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dataset_detail.h"

namespace cleave::core::detail {

namespace {

constexpr std::uint64_t cifar_pixels = 3 * 32 * 32;

struct cifar_format {
  const char* name;
  std::uint64_t label_bytes;  // before the pixels: CIFAR-10 the label, CIFAR-100 coarse then fine
  int n_classes;              // of the label used (the last label byte)
  int n_coarse;               // CIFAR-100's superclasses (0: no coarse label)
  std::vector<std::string> train, test;

  std::uint64_t record() const { return label_bytes + cifar_pixels; }
};

const cifar_format& format_of(cifar_kind k) {
  static const cifar_format c10{
      "CIFAR-10",
      1,
      10,
      0,
      {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"},
      {"test_batch.bin"}};
  static const cifar_format c100{"CIFAR-100", 2, 100, 20, {"train.bin"}, {"test.bin"}};
  return k == cifar_kind::cifar10 ? c10 : c100;
}

struct file_closer {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// One CIFAR binary file: its size is checked when opened; records are read in file order.
class cifar_file {
 public:
  cifar_file(std::string path, const cifar_format& f) : path_(std::move(path)), f_(&f) {
    std::error_code ec;
    const std::uint64_t bytes = std::filesystem::file_size(path_, ec);
    if (ec) throw error("data file '" + path_ + "': cannot read its size (" + ec.message() + ")");
    if (bytes == 0) throw error("data file '" + path_ + "': empty (no " + f.name + " records)");
    if (bytes % f.record())
      throw error("data file '" + path_ + "': " + std::to_string(bytes) + " bytes, not a whole number of " +
                  std::to_string(f.record()) + "-byte " + f.name + " records");
    n_ = bytes / f.record();
    open();
  }
  std::uint64_t size() const { return n_; }
  const std::string& path() const { return path_; }

  // Appends the label of every record to `out` (the fine label for CIFAR-100), checking each.
  void read_labels(std::vector<std::int32_t>& out) {
    const std::uint64_t rec = f_->record();
    constexpr std::uint64_t chunk = 512;
    std::vector<std::uint8_t> buf(chunk * rec);
    for (std::uint64_t first = 0; first < n_; first += chunk) {
      const std::uint64_t count = std::min(chunk, n_ - first);
      read(buf.data(), count * rec, "the records");
      for (std::uint64_t r = 0; r < count; ++r) {
        const std::uint8_t* p = buf.data() + r * rec;
        if (f_->n_coarse && p[0] >= f_->n_coarse)
          throw error("data file '" + path_ + "': record " + std::to_string(first + r) + " has coarse label " +
                      std::to_string(p[0]) + ", out of range for " + f_->name + "'s " + std::to_string(f_->n_coarse) +
                      " superclasses");
        const std::uint8_t label = p[f_->label_bytes - 1];
        if (label >= f_->n_classes)
          throw error("data file '" + path_ + "': record " + std::to_string(first + r) + " has label " +
                      std::to_string(label) + ", out of range for " + f_->name + "'s " + std::to_string(f_->n_classes) +
                      " classes");
        out.push_back(label);
      }
    }
    open();  // the pixels are read from the start again
  }

  // The pixels of the next `count` records into dst (count,3,32,32): the files store them so.
  void read_pixels(std::uint64_t count, std::uint8_t* dst) {
    std::uint8_t labels[2];
    for (std::uint64_t r = 0; r < count; ++r, dst += cifar_pixels) {
      read(labels, f_->label_bytes, "the labels");
      read(dst, cifar_pixels, "the pixels");
    }
  }

 private:
  void open() {
    f_file_.reset(std::fopen(path_.c_str(), "rb"));
    if (!f_file_) throw error("data file '" + path_ + "': cannot open (" + std::strerror(errno) + ")");
  }
  void read(void* dst, std::uint64_t n, const char* what) {
    if (std::fread(dst, 1, n, f_file_.get()) != n) {
      if (std::ferror(f_file_.get())) throw error("data file '" + path_ + "': read error while reading " + what);
      throw error("data file '" + path_ + "': truncated while reading " + what);  // shrunk since opened
    }
  }

  std::string path_;
  const cifar_format* f_;
  std::unique_ptr<std::FILE, file_closer> f_file_;
  std::uint64_t n_ = 0;
};

// A split stored in one or more files, read as one sequence of records.
class cifar_split {
 public:
  cifar_split(const std::string& dir, const std::vector<std::string>& names, const cifar_format& f) {
    for (const auto& n : names)
      if (!std::filesystem::exists(dir + "/" + n)) {
        std::string all;
        for (const auto& m : f.train) all += (all.empty() ? "" : ", ") + m;
        for (const auto& m : f.test) all += ", " + m;
        throw error("data directory '" + dir + "': no " + n + " (" + f.name + " needs " + all + ")");
      }
    for (const auto& n : names) {
      files_.emplace_back(dir + "/" + n, f);
      n_ += files_.back().size();
    }
  }
  std::uint64_t size() const { return n_; }
  std::uint64_t per_sample() const { return cifar_pixels; }
  std::vector<std::int32_t> labels() {
    std::vector<std::int32_t> y;
    y.reserve(n_);
    for (auto& f : files_) f.read_labels(y);
    return y;
  }
  // The next `count` samples, continuing into the next file where one ends.
  void read_nchw(std::uint64_t count, std::uint8_t* dst) {
    while (count) {
      CLEAVE_ASSERT(file_ < files_.size(), "reads within the split");
      const std::uint64_t here = std::min(count, files_[file_].size() - in_file_);
      files_[file_].read_pixels(here, dst);
      dst += here * cifar_pixels;
      count -= here;
      in_file_ += here;
      if (in_file_ == files_[file_].size()) ++file_, in_file_ = 0;
    }
  }
  void expect_end() const { CLEAVE_ASSERT(file_ == files_.size(), "the whole split read"); }

 private:
  std::vector<cifar_file> files_;
  std::uint64_t n_ = 0;
  std::size_t file_ = 0;
  std::uint64_t in_file_ = 0;
};

}  // namespace

dataset_split load_cifar(const std::string& name, const std::string& dir, cifar_kind kind, const load_options& o) {
  const cifar_format& f = format_of(kind);
  // Every file is found and size-checked, and every label read, before any pixel.
  cifar_split train(dir, f.train, f), test(dir, f.test, f);
  const auto train_labels = train.labels();
  auto test_labels = test.labels();

  dataset_split s;
  for (dataset* d : {&s.train, &s.test}) {
    d->name = name;
    d->item = shape{3, 32, 32};
    d->n_classes = f.n_classes;
  }
  const auto keep = kept_samples(o, train_labels, f.n_classes);
  channel_stats stats(3);
  s.train.pixels = stream_train(train, keep, stats, "data directory '" + dir + "'");
  s.train.y.resize(keep.size());
  for (std::size_t i = 0; i < keep.size(); ++i) s.train.y[i] = train_labels[static_cast<std::size_t>(keep[i])];
  s.train.table = s.test.table = stats.table();
  if (o.test) {
    s.test.pixels.resize(test.size() * cifar_pixels);
    test.read_nchw(test.size(), s.test.pixels.data());
    test.expect_end();
    s.test.y = std::move(test_labels);
  }
  return s;
}

}  // namespace cleave::core::detail
