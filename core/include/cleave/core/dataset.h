// Image classification data sets in IDX form (optionally gzip-compressed) or CIFAR binary form:
// reading, checking, normalising, batching with seeded augmentation, and where Fashion-MNIST is.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cleave/core/augment.h"
#include "cleave/core/data_source.h"
#include "cleave/core/shape.h"

namespace cleave::core {

// Samples are kept as the file stores them (u8 pixels, a quarter of float32) and normalised
// when a batch is drawn: `gather` gives exactly the float values a whole float copy would hold.
// A dataset is a data_source: whatever trains on an app's own source trains on a file's samples.
struct dataset : data_source {
  std::string name;
  shape item;  // per sample: (C,H,W)
  int n_classes = 0;
  std::vector<std::uint8_t> pixels;  // size() * item.numel(), (N,C,H,W)
  std::vector<std::int32_t> y;       // size() labels in [0, n_classes)
  // The float value of every pixel value in every channel: table[c * 256 + p].
  std::vector<float> table;

  std::int64_t size() const override { return static_cast<std::int64_t>(y.size()); }
  shape sample_shape() const override { return item; }
  int class_count() const override { return n_classes; }
  std::vector<std::int32_t> labels() const override { return y; }
  std::string describe() const override { return name; }
  std::map<std::string, std::string> input_normalisation() const override;
  void fetch(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out) const override {
    gather(idx, n, x_out, y_out);
  }
  void fetch_augmented(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out,
                       const augment_config& a, std::uint64_t seed, std::int64_t epoch) const override {
    gather(idx, n, x_out, y_out, a, seed, epoch);
  }
  // Normalised samples idx[0, n) into x_out (n * item) and their labels into y_out (n).
  void gather(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out) const;
  // As above, each sample augmented as `a` says with the draws of (seed, epoch, idx[i]). With
  // nothing enabled the output is exactly gather's.
  void gather(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out, const augment_config& a,
              std::uint64_t seed, std::int64_t epoch) const;
  // The samples idx, in that order (same name, shape, classes and normalisation).
  dataset subset(std::span<const std::int64_t> idx) const;
};

struct dataset_split {
  dataset train, test;
};

// Reads an IDX image file (u8, 3 or 4 dims) and its label file (u8, 1 dim). Files may be
// gzip-compressed. Pixels come out scaled to [0,1]. Errors name the file and what is wrong.
dataset read_idx_pair(const std::string& images_path, const std::string& labels_path);

// Which parts of a data set a node reads.
struct load_options {
  bool test = true;  // the test split (nodes that evaluate)
  // The training samples kept, in this order, chosen from the training labels and the class
  // count (unset: all). An index out of range is an error.
  std::function<std::vector<std::int64_t>(const std::vector<std::int32_t>& labels, int n_classes)> pick_train;
};

// `name_or_dir`: "fashion-mnist" (Debian's dataset-fashion-mnist), or a directory holding one
// of these layouts, found by the files it holds:
// - IDX: train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz],
//   t10k-labels-idx1-ubyte[.gz]; the class count is over both splits' labels.
// - CIFAR-10 binary: data_batch_1.bin .. data_batch_5.bin (training, in that order) and
//   test_batch.bin; records of 1 label byte and 3072 pixel bytes (3,32,32); 10 classes.
// - CIFAR-100 binary: train.bin and test.bin; records of a coarse label byte, a fine label byte
//   and 3072 pixel bytes; the fine labels, 100 classes.
// A CIFAR directory may also be the one its official archive unpacks to: a directory holding
// cifar-10-batches-bin/ or cifar-100-binary/ is read from there.
// Pixels are scaled to [0,1] and normalised per channel with the whole training split's mean
// and standard deviation, whatever part of it is kept. The training images are streamed: only
// the kept samples stay in memory. Errors name the file or directory and what is wrong.
dataset_split load_dataset(const std::string& name_or_dir, const load_options& o = {});

// Where `fashion-mnist` is looked up.
inline constexpr const char* fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

// A permutation of [0, n) for an epoch: the same for the same (seed, epoch) everywhere.
std::vector<std::int64_t> epoch_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

}  // namespace cleave::core
