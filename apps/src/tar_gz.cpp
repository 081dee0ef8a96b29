// ustar headers written by hand (POSIX.1-1988 layout, 512-byte blocks), deflated in memory by
// zlib with a gzip wrapper.
#include "tar_gz.h"

#include <zlib.h>

#include <array>
#include <cstring>

#include "cleave/core/error.h"

namespace cleave::apps {

namespace {

constexpr std::size_t block = 512;

// Header layout (offset, size): name 0/100, mode 100/8, uid 108/8, gid 116/8, size 124/12,
// mtime 136/12, chksum 148/8, typeflag 156/1, linkname 157/100, magic 257/6 ("ustar\0"),
// version 263/2 ("00"), uname 265/32, gname 297/32, devmajor 329/8, devminor 337/8,
// prefix 345/155, padding to 512.
using header = std::array<char, block>;

void put_text(header& h, std::size_t at, std::size_t size, const std::string& s) {
  std::memcpy(h.data() + at, s.data(), std::min(s.size(), size));
}

// An octal number in `size` bytes: size - 1 digits, then NUL.
void put_octal(header& h, std::size_t at, std::size_t size, unsigned long long v) {
  for (std::size_t i = size - 1; i-- > 0;) {
    h[at + i] = static_cast<char>('0' + (v & 7));
    v >>= 3;
  }
  h[at + size - 1] = '\0';
  if (v != 0) throw core::error("tar: value too large for its header field");
}

// name and prefix of `path`: the whole path as name when it fits in 100 bytes, else split at a
// '/' into a prefix of at most 155 bytes and a name of at most 100.
std::pair<std::string, std::string> split_path(const std::string& path) {
  if (path.size() <= 100) return {path, ""};
  for (std::size_t i = path.size(); i-- > 0;) {
    if (path[i] != '/') continue;
    const std::size_t name_len = path.size() - i - 1;
    if (name_len > 100) break;
    if (i <= 155 && name_len > 0) return {path.substr(i + 1), path.substr(0, i)};
  }
  throw core::error("tar: path '" + path + "' is too long for a ustar archive");
}

header make_header(const archive_entry& e, std::time_t mtime) {
  header h{};
  const std::string path = e.directory ? e.path + "/" : e.path;
  for (std::size_t from = 0;;) {  // relative, no empty, "." or ".." component
    const std::size_t slash = e.path.find('/', from);
    const std::string part = e.path.substr(from, slash == std::string::npos ? std::string::npos : slash - from);
    if (part.empty() || part == "." || part == "..") throw core::error("tar: bad entry path '" + e.path + "'");
    if (slash == std::string::npos) break;
    from = slash + 1;
  }
  const auto [name, prefix] = split_path(path);
  put_text(h, 0, 100, name);
  put_octal(h, 100, 8, e.mode & 07777);
  put_octal(h, 108, 8, 0);
  put_octal(h, 116, 8, 0);
  put_octal(h, 124, 12, e.directory ? 0 : e.data.size());
  put_octal(h, 136, 12, static_cast<unsigned long long>(mtime < 0 ? 0 : mtime));
  h[156] = e.directory ? '5' : '0';
  put_text(h, 257, 6, std::string("ustar\0", 6));
  put_text(h, 263, 2, "00");
  put_text(h, 265, 32, archive_owner);
  put_text(h, 297, 32, archive_owner);
  put_octal(h, 329, 8, 0);
  put_octal(h, 337, 8, 0);
  put_text(h, 345, 155, prefix);
  // The checksum: the sum of the header's bytes with its own field taken as spaces, written as
  // six octal digits, NUL, space.
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  put_octal(h, 148, 7, sum);
  h[155] = ' ';
  return h;
}

std::string zlib_failure(const char* call, int rc, const z_stream& zs) {
  return std::string(call) + " failed: " + (zs.msg ? zs.msg : zError(rc));
}

std::string gzip(const std::string& raw) {
  z_stream zs{};
  int rc = deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16 /* gzip wrapper */, 8, Z_DEFAULT_STRATEGY);
  if (rc != Z_OK) throw core::error(zlib_failure("deflateInit2", rc, zs));
  std::string out(deflateBound(&zs, static_cast<uLong>(raw.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  rc = deflate(&zs, Z_FINISH);
  if (rc != Z_STREAM_END) {
    const std::string why = zlib_failure("deflate", rc, zs);
    deflateEnd(&zs);
    throw core::error(why);
  }
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

}  // namespace

std::string tar_gz(const std::vector<archive_entry>& entries, std::time_t mtime) {
  std::string raw;
  for (const auto& e : entries) {
    const header h = make_header(e, mtime);
    raw.append(h.data(), h.size());
    if (e.directory) continue;
    raw += e.data;
    raw.append((block - e.data.size() % block) % block, '\0');
  }
  // The end: two zero blocks, then zeros up to a whole record of 20 blocks (what tar writes).
  raw.append(2 * block, '\0');
  raw.append((20 * block - raw.size() % (20 * block)) % (20 * block), '\0');
  return gzip(raw);
}

}  // namespace cleave::apps
