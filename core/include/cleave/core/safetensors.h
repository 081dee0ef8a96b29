// safetensors files: named tensors that PyTorch, JAX and others load without running code
// from the file. Written atomically (OUT.tmp, fsync, rename): an error leaves no partial file.
//
// Layout: u64 little-endian N | N bytes of UTF-8 JSON header, padded with spaces to a multiple
// of 8 | the data, every tensor little-endian and row-major, packed in the order given. The
// header maps each tensor's name to {"dtype": "F32" | "I64", "shape": [...],
// "data_offsets": [begin, end]} (bytes into the data after the header), and "__metadata__" to
// an object of strings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace cleave::core {

struct safetensor {
  std::string name;
  std::string dtype;                // "F32" or "I64"
  std::vector<std::int64_t> shape;  // [] for a scalar
  std::vector<std::byte> bytes;     // product(shape) elements

  static safetensor f32(std::string name, std::vector<std::int64_t> shape, std::span<const float> values);
  static safetensor i64(std::string name, std::vector<std::int64_t> shape, std::span<const std::int64_t> values);
};

// Throws core::error naming `path` when it cannot be written; names must be unique.
void save_safetensors(const std::string& path, const std::vector<safetensor>& tensors,
                      const std::map<std::string, std::string>& metadata);

}  // namespace cleave::core
