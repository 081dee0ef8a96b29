// Writing safetensors files: the header, the packed data, the atomic rename.
#include "cleave/core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "cleave/core/error.h"

namespace cleave::core {

// The data is the host's memory as is.
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

std::size_t element_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "I64") return 8;
  throw error("safetensors: dtype '" + dtype + "' is not written here (F32 or I64)");
}

template <class T>
safetensor make(std::string name, const char* dtype, std::vector<std::int64_t> shape, std::span<const T> values) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  CLEAVE_ASSERT(static_cast<std::size_t>(n) == values.size(), "safetensor values match the shape");
  safetensor t{std::move(name), dtype, std::move(shape), std::vector<std::byte>(values.size_bytes())};
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), values.size_bytes());
  return t;
}

void write_all(int fd, const void* p, std::size_t n, const std::string& where) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw error(where + "write failed: " + std::strerror(errno));
    }
    c += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

safetensor safetensor::f32(std::string name, std::vector<std::int64_t> shape, std::span<const float> values) {
  return make(std::move(name), "F32", std::move(shape), values);
}

safetensor safetensor::i64(std::string name, std::vector<std::int64_t> shape, std::span<const std::int64_t> values) {
  return make(std::move(name), "I64", std::move(shape), values);
}

void save_safetensors(const std::string& path, const std::vector<safetensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string where = "safetensors file '" + path + "': ";
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    CLEAVE_ASSERT(t.name != "__metadata__" && names.insert(t.name).second, "safetensor names unique");
    std::uint64_t n = 1;
    for (auto d : t.shape) n *= static_cast<std::uint64_t>(d);
    CLEAVE_ASSERT(n * element_size(t.dtype) == t.bytes.size(), "safetensor bytes match dtype and shape");
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // the data then starts 8-byte aligned

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw error(where + "cannot create '" + tmp + "': " + std::strerror(errno));
  try {
    const std::uint64_t n = header.size();
    write_all(fd, &n, sizeof n, where);
    write_all(fd, header.data(), header.size(), where);
    for (const auto& t : tensors) write_all(fd, t.bytes.data(), t.bytes.size(), where);
    if (::fsync(fd) != 0) throw error(where + "fsync failed: " + std::strerror(errno));
  } catch (const error&) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw error(where + "close failed: " + why);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw error(where + "cannot rename '" + tmp + "' into place: " + why);
  }
}

}  // namespace cleave::core
