// Checkpoint files: atomic writes and verified reads.
#include "cleave/core/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace cleave::core {

namespace {

using json = nlohmann::json;
constexpr char k_magic[8] = {'C', 'L', 'V', 'C', 'K', 'P', 'T', '1'};
constexpr std::uint64_t k_max_header = 64ull << 20;
// A model at the spec limit with two optimizer moments per parameter, and its header.
constexpr std::uintmax_t k_max_file = 16ull << 30;

std::string sys_error() {
  return std::strerror(errno);
}

void write_all(int fd, const void* p, std::size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw error("checkpoint '" + path + "': write failed: " + sys_error());
    }
    c += w;
    n -= static_cast<std::size_t>(w);
  }
}

json shape_json(const shape& s) {
  json a = json::array();
  for (int i = 0; i < s.rank(); ++i) a.push_back(s[i]);
  return a;
}

}  // namespace

void save_checkpoint(const std::string& path, const checkpoint& c) {
  json h;
  h["model"] = json::parse(c.model_json);
  h["seed"] = c.seed;
  h["epoch"] = c.epoch;
  h["step"] = c.step;
  h["optimizer"] = c.optimizer;
  json list = json::array();
  std::uint64_t offset = 0;
  for (const auto& t : c.tensors) {
    CLEAVE_ASSERT(static_cast<std::int64_t>(t.values.size()) == t.dims.numel(), "checkpoint entry size");
    list.push_back({{"name", t.name}, {"dtype", "f32"}, {"shape", shape_json(t.dims)}, {"offset", offset}});
    offset += t.values.size() * sizeof(float);
  }
  h["tensors"] = list;
  if (!c.meta.empty()) h["meta"] = c.meta;
  const std::string header = h.dump();

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw error("checkpoint '" + path + "': cannot create '" + tmp + "': " + sys_error());
  try {
    uLong crc = crc32(0L, Z_NULL, 0);
    auto put = [&](const void* p, std::size_t n) {
      write_all(fd, p, n, path);
      const auto* b = static_cast<const Bytef*>(p);
      for (std::size_t done = 0; done < n;) {
        const auto chunk = static_cast<uInt>(std::min<std::size_t>(n - done, 1u << 30));
        crc = crc32(crc, b + done, chunk);
        done += chunk;
      }
    };
    const std::uint64_t hlen = header.size();
    put(k_magic, sizeof k_magic);
    put(&hlen, sizeof hlen);
    put(header.data(), header.size());
    for (const auto& t : c.tensors) put(t.values.data(), t.values.size() * sizeof(float));
    const std::uint32_t crc32v = static_cast<std::uint32_t>(crc);
    write_all(fd, &crc32v, sizeof crc32v, path);
    if (::fsync(fd) != 0) throw error("checkpoint '" + path + "': fsync failed: " + sys_error());
    if (::close(fd) != 0) throw error("checkpoint '" + path + "': close failed: " + sys_error());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = sys_error();
    ::unlink(tmp.c_str());
    throw error("checkpoint '" + path + "': cannot rename into place: " + why);
  }
}

const checkpoint::entry* checkpoint::find(const std::string& name) const {
  for (const auto& e : tensors)
    if (e.name == name) return &e;
  return nullptr;
}

checkpoint load_checkpoint(const std::string& path) {
  const std::string where = "checkpoint '" + path + "': ";
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec) throw error(where + "cannot open (" + ec.message() + ")");
  if (!std::filesystem::is_regular_file(st)) throw error(where + "not a regular file");
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size > k_max_file)
    throw error(where +
                (ec ? "cannot read its size (" + ec.message() + ")" : "larger than the 16 GiB a checkpoint may be"));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw error(where + "cannot open (" + sys_error() + ")");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() < sizeof k_magic + 8 + 4) throw error(where + "too short to be a checkpoint");
  if (std::memcmp(bytes.data(), k_magic, sizeof k_magic) != 0)
    throw error(where + "not a cleave checkpoint (bad magic)");
  std::uint32_t stored_crc;
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - 4, 4);
  const auto body = bytes.size() - 4;
  const auto crc = static_cast<std::uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(body)));
  if (crc != stored_crc) throw error(where + "corrupt or truncated (CRC mismatch)");
  std::uint64_t hlen;
  std::memcpy(&hlen, bytes.data() + sizeof k_magic, 8);
  const std::size_t payload_at = sizeof k_magic + 8 + hlen;
  if (hlen > k_max_header || payload_at > body) throw error(where + "header length out of range");
  checkpoint c;
  json h;
  try {
    // Nesting is bounded while parsing (the model spec's limit, and the header's own levels
    // around it): a deeper header would overflow the stack of the recursive dump below.
    constexpr int max_depth = spec_limits::max_depth + 2;
    h = json::parse(bytes.begin() + sizeof k_magic + 8, bytes.begin() + static_cast<std::ptrdiff_t>(payload_at),
                    [](int depth, json::parse_event_t, json&) {
                      if (depth > max_depth)
                        throw error("header nested deeper than " + std::to_string(max_depth) + " levels");
                      return true;
                    });
    c.model_json = h.at("model").dump();
    c.seed = h.at("seed").get<std::uint64_t>();
    c.epoch = h.at("epoch").get<std::int64_t>();
    c.step = h.at("step").get<std::int64_t>();
    c.optimizer = h.at("optimizer").get<std::string>();
    if (h.contains("meta")) c.meta = h.at("meta").get<std::map<std::string, std::string>>();
    const std::size_t payload = body - payload_at;
    for (const auto& t : h.at("tensors")) {
      checkpoint::entry e;
      e.name = t.at("name").get<std::string>();
      if (t.at("dtype").get<std::string>() != "f32") throw error("tensor '" + e.name + "': unsupported dtype");
      const auto& s = t.at("shape");
      if (!s.is_array() || s.size() > 4) throw error("tensor '" + e.name + "': bad shape");
      std::vector<std::int64_t> dims;
      for (const auto& d : s) {
        const auto v = d.get<std::int64_t>();
        if (v < 0 || v > (std::int64_t{1} << 40)) throw error("tensor '" + e.name + "': bad shape");
        dims.push_back(v);
      }
      switch (dims.size()) {
        case 0:
          e.dims = shape{};
          break;
        case 1:
          e.dims = shape{dims[0]};
          break;
        case 2:
          e.dims = shape{dims[0], dims[1]};
          break;
        case 3:
          e.dims = shape{dims[0], dims[1], dims[2]};
          break;
        default:
          e.dims = shape{dims[0], dims[1], dims[2], dims[3]};
          break;
      }
      const auto off = t.at("offset").get<std::uint64_t>();
      const auto n = static_cast<std::uint64_t>(e.dims.numel());
      if (n > payload / 4 || off > payload - n * 4) throw error("tensor '" + e.name + "': data out of the file");
      e.values.resize(n);
      std::memcpy(e.values.data(), bytes.data() + payload_at + off, n * 4);
      c.tensors.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    throw error(where + "bad header: " + e.what());
  } catch (const error& e) {
    throw error(where + e.what());
  }
  return c;
}

checkpoint capture(const stage& s, const optimizer& opt, std::uint64_t seed, std::int64_t epoch) {
  checkpoint c;
  c.model_json = s.model().json;
  c.seed = seed;
  c.epoch = epoch;
  c.step = opt.steps_taken();
  c.optimizer = opt.config().kind == optimizer_kind::sgd ? "sgd" : "adamw";
  backend& b = s.device();
  auto add = [&](const std::string& name, const tensor& t) {
    checkpoint::entry e{name, t.shape(), std::vector<float>(static_cast<std::size_t>(t.numel()))};
    b.download(t, e.values.data());
    c.tensors.push_back(std::move(e));
  };
  for (const auto& p : s.named_params()) add("p:" + p.name, p.value);
  for (const auto& p : s.named_buffers()) add("s:" + p.name, p.value);
  for (std::size_t k = 0; k < opt.state().size(); ++k) add("o" + std::to_string(k) + ":all", opt.state()[k]);
  return c;
}

void restore(stage& s, optimizer& opt, const checkpoint& c) {
  if (c.model_json != s.model().json) throw error("checkpoint is of another model than '" + s.model().name + "'");
  backend& b = s.device();
  auto find = [&](const std::string& name, const tensor& t) {
    for (const auto& e : c.tensors)
      if (e.name == name) {
        if (!(e.dims == t.shape()))
          throw error("checkpoint tensor '" + name + "' has shape " + e.dims.str() + ", expected " + t.shape().str());
        b.upload(t, e.values.data());
        return;
      }
    throw error("checkpoint has no tensor '" + name + "'");
  };
  for (const auto& p : s.named_params()) find("p:" + p.name, p.value);
  for (const auto& p : s.named_buffers()) find("s:" + p.name, p.value);
  const std::string kind = opt.config().kind == optimizer_kind::sgd ? "sgd" : "adamw";
  if (c.optimizer == kind)
    for (std::size_t k = 0; k < opt.state().size(); ++k) find("o" + std::to_string(k) + ":all", opt.state()[k]);
  opt.set_steps_taken(c.step);
}

std::vector<std::string> checkpoint_series::files() const {
  std::vector<std::string> out{path_, path_ + ".next"};
  for (int k = 1; k <= keep_; ++k) out.push_back(path_ + "." + std::to_string(k));
  return out;
}

void checkpoint_series::check_writable(const std::string& what) const {
  namespace fs = std::filesystem;
  const fs::path p = path_;
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  const std::string where = what + " '" + path_ + "': ";
  if (fs::is_directory(p, ec)) throw error(where + "is a directory");
  if (!fs::exists(dir, ec)) throw error(where + "directory '" + dir.string() + "' does not exist");
  if (!fs::is_directory(dir, ec)) throw error(where + "'" + dir.string() + "' is not a directory");
  // Writable as the checkpoint will be written: a temporary file beside it.
  const std::string probe = path_ + ".probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw error(where + "cannot write in '" + dir.string() + "': " + sys_error());
  ::close(fd);
  fs::remove(probe, ec);
}

std::string checkpoint_series::save(const checkpoint& c) const {
  namespace fs = std::filesystem;
  const auto f = files();
  try {
    save_checkpoint(f[1], c);
  } catch (const error& e) {
    return e.what();
  }
  std::error_code ec;
  for (int k = keep_; k >= 1; --k) {
    const std::string& from = k == 1 ? f[0] : f[static_cast<std::size_t>(k)];
    if (fs::exists(from, ec)) fs::rename(from, f[static_cast<std::size_t>(k + 1)], ec);
    if (ec) return "cannot keep '" + from + "': " + ec.message();
  }
  fs::rename(f[1], f[0], ec);
  return ec ? "cannot rename '" + f[1] + "' into place: " + ec.message() : std::string();
}

checkpoint_series::found checkpoint_series::newest() const {
  found r;
  for (const auto& f : files()) {
    std::error_code ec;
    if (!std::filesystem::exists(f, ec)) continue;
    try {
      auto c = load_checkpoint(f);
      if (!r.newest || c.epoch > r.newest->epoch) {
        r.newest = std::move(c);
        r.from = f;
      }
    } catch (const error& e) {
      r.unreadable.emplace_back(f, e.what());
    }
  }
  return r;
}

}  // namespace cleave::core
