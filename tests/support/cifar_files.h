// Tiny CIFAR-10 and CIFAR-100 binary files written by tests: a few records whose pixels and
// labels follow from the record's position, in a folder removed when the test program ends.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace cleave::testing {

// The folders the tests made, removed when the test program ends.
struct cifar_dirs {
  std::vector<std::filesystem::path> all;
  ~cifar_dirs() {
    std::error_code ec;
    for (const auto& d : all) std::filesystem::remove_all(d, ec);
  }
};
inline cifar_dirs& cifar_made() {
  static cifar_dirs m;
  return m;
}

// A new empty folder under the temporary directory.
inline std::filesystem::path cifar_temp_dir(const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("cleave-test-" + std::to_string(::getpid()) + "-cifar-" + name);
  std::filesystem::remove_all(dir);
  cifar_made().all.push_back(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Pixel j (of 3072, CHW) of the record at global position `s` of a split.
inline std::uint8_t cifar_pixel(int split, int s, int j) {
  return static_cast<std::uint8_t>((s * 131 + j * 7 + (j / 1024) * 50 + (j * j) % 13 + split * 17) % 256);
}

// `n` records starting at global position `first`: CIFAR-10 (label (s*3)%10) or CIFAR-100
// (coarse (s%20), fine (s*7)%100).
inline std::string cifar_records(bool hundred, int split, int first, int n) {
  std::string b;
  for (int s = first; s < first + n; ++s) {
    if (hundred) {
      b.push_back(static_cast<char>(s % 20));
      b.push_back(static_cast<char>((s * 7) % 100));
    } else {
      b.push_back(static_cast<char>((s * 3) % 10));
    }
    for (int j = 0; j < 3072; ++j) b.push_back(static_cast<char>(cifar_pixel(split, s, j)));
  }
  return b;
}

inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

// CIFAR-10 training batches of these sizes (data_batch_1.bin ..) and a test batch of n_test.
inline void write_cifar10(const std::filesystem::path& dir, const std::vector<int>& batches, int n_test) {
  int first = 0;
  for (std::size_t b = 0; b < batches.size(); ++b) {
    write_bytes(dir / ("data_batch_" + std::to_string(b + 1) + ".bin"), cifar_records(false, 0, first, batches[b]));
    first += batches[b];
  }
  write_bytes(dir / "test_batch.bin", cifar_records(false, 1, 0, n_test));
}

inline void write_cifar100(const std::filesystem::path& dir, int n_train, int n_test) {
  write_bytes(dir / "train.bin", cifar_records(true, 0, 0, n_train));
  write_bytes(dir / "test.bin", cifar_records(true, 1, 0, n_test));
}

}  // namespace cleave::testing
