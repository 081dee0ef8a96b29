// A safetensors reader of the tests' own, independent of the writer: it checks the layout
// (header length, padding, offsets packed in order from 0 to the end of the file, byte counts
// matching dtype and shape) while reading.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cleave::testing {

// One tensor as read from a safetensors file.
struct read_tensor {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::string bytes;
};
struct read_file {
  std::uint64_t header_len = 0;
  std::map<std::string, read_tensor> tensors;
  nlohmann::json metadata;
};

inline read_file read_safetensors(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE(f);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() >= 8);
  read_file out;
  for (int i = 7; i >= 0; --i) out.header_len = (out.header_len << 8) | static_cast<unsigned char>(bytes[i]);
  CHECK(out.header_len % 8 == 0);
  REQUIRE(8 + out.header_len <= bytes.size());
  const std::string header = bytes.substr(8, out.header_len);
  const auto h = nlohmann::json::parse(header);
  CHECK(header.find_last_not_of(' ') + 1 == header.find_last_of('}') + 1);  // only spaces after the JSON
  const std::string data = bytes.substr(8 + out.header_len);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      out.metadata = v;
      continue;
    }
    read_tensor t;
    t.dtype = v.at("dtype").get<std::string>();
    t.shape = v.at("shape").get<std::vector<std::int64_t>>();
    const auto off = v.at("data_offsets").get<std::vector<std::uint64_t>>();
    REQUIRE(off.size() == 2);
    REQUIRE(off[0] <= off[1]);
    REQUIRE(off[1] <= data.size());
    std::uint64_t n = 1;
    for (auto d : t.shape) n *= static_cast<std::uint64_t>(d);
    const std::uint64_t elem = t.dtype == "F32" ? 4 : t.dtype == "I64" ? 8 : 0;
    CHECK(elem != 0);
    CHECK(off[1] - off[0] == n * elem);
    t.bytes = data.substr(off[0], off[1] - off[0]);
    spans.emplace_back(off[0], off[1]);
    CHECK(out.tensors.emplace(name, std::move(t)).second);
  }
  std::sort(spans.begin(), spans.end());
  std::uint64_t at = 0;
  for (const auto& [b, e] : spans) {
    CHECK(b == at);  // contiguous, no holes, no overlaps
    at = e;
  }
  CHECK(at == data.size());
  return out;
}

}  // namespace cleave::testing
