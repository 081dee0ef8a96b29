// Image classification data sets in IDX form (optionally gzip-compressed): reading, checking,
// normalising, batching, and the default location of Fashion-MNIST.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cleave/core/shape.h"

namespace cleave::core {

// Samples are kept as the file stores them (u8 pixels, a quarter of float32) and normalised
// when a batch is drawn: `gather` gives exactly the float values a whole float copy would hold.
struct dataset {
  std::string name;
  shape item;  // per sample: (C,H,W)
  int n_classes = 0;
  std::vector<std::uint8_t> pixels;  // size() * item.numel(), (N,C,H,W)
  std::vector<std::int32_t> y;       // size() labels in [0, n_classes)
  // The float value of every pixel value in every channel: table[c * 256 + p].
  std::vector<float> table;

  std::int64_t size() const { return static_cast<std::int64_t>(y.size()); }
  // Normalised samples idx[0, n) into x_out (n * item) and their labels into y_out (n).
  void gather(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out) const;
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

// `name_or_dir`: "fashion-mnist" (Debian's dataset-fashion-mnist), or a directory holding
// train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz],
// t10k-labels-idx1-ubyte[.gz]. Pixels are scaled to [0,1] and normalised per channel with the
// whole training split's mean and standard deviation, whatever part of it is kept; the class
// count is over both splits' labels. The training images are streamed: only the kept samples
// stay in memory.
dataset_split load_dataset(const std::string& name_or_dir, const load_options& o = {});

// Where `fashion-mnist` is looked up.
inline constexpr const char* fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

// A permutation of [0, n) for an epoch: the same for the same (seed, epoch) everywhere.
std::vector<std::int64_t> epoch_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

}  // namespace cleave::core
