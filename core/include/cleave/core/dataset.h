// Image classification data sets in IDX form (optionally gzip-compressed): reading, checking,
// normalising, batching, and the default location of Fashion-MNIST.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cleave/core/shape.h"

namespace cleave::core {

struct dataset {
  std::string name;
  shape item;  // per sample: (C,H,W)
  int n_classes = 0;
  std::vector<float> x;         // size() * item.numel(), normalised
  std::vector<std::int32_t> y;  // size() labels in [0, n_classes)

  std::int64_t size() const { return static_cast<std::int64_t>(y.size()); }
  // Copies samples idx[first, first + n) into x_out (n * item) and y_out (n).
  void gather(const std::int64_t* idx, std::int64_t n, float* x_out, std::int32_t* y_out) const;
};

struct dataset_split {
  dataset train, test;
};

// Reads an IDX image file (u8, 3 or 4 dims) and its label file (u8, 1 dim). Files may be
// gzip-compressed. Errors name the file and what is wrong with it.
dataset read_idx_pair(const std::string& images_path, const std::string& labels_path);

// `name_or_dir`: "fashion-mnist" (Debian's dataset-fashion-mnist), or a directory holding
// train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz],
// t10k-labels-idx1-ubyte[.gz]. Pixels are scaled to [0,1] and normalised per channel with the
// training set's mean and standard deviation.
dataset_split load_dataset(const std::string& name_or_dir);

// Where `fashion-mnist` is looked up.
inline constexpr const char* fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

// A permutation of [0, n) for an epoch: the same for the same (seed, epoch) everywhere.
std::vector<std::int64_t> epoch_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

}  // namespace cleave::core
