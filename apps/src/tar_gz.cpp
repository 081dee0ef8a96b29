// A ustar archive, gzip-compressed, written into memory by libarchive.
#include "tar_gz.h"

#include <archive.h>
#include <archive_entry.h>

#include <memory>

#include "cleave/core/error.h"

namespace cleave::apps {

namespace {

using archive_ptr = std::unique_ptr<::archive, decltype(&archive_write_free)>;
using entry_ptr = std::unique_ptr<::archive_entry, decltype(&archive_entry_free)>;

// libarchive's failure of `call`, with its message.
[[noreturn]] void fail(::archive* a, const std::string& call) {
  const char* why = archive_error_string(a);
  throw core::error("tar: " + call + " failed: " + (why ? why : "unknown error"));
}

// A relative path of no empty, "." or ".." component.
void check_path(const std::string& path) {
  for (std::size_t from = 0;;) {
    const std::size_t slash = path.find('/', from);
    const std::string part = path.substr(from, slash == std::string::npos ? std::string::npos : slash - from);
    if (part.empty() || part == "." || part == "..") throw core::error("tar: bad entry path '" + path + "'");
    if (slash == std::string::npos) return;
    from = slash + 1;
  }
}

// libarchive's output callback: appends to the string.
la_ssize_t append(::archive*, void* out, const void* data, std::size_t n) {
  static_cast<std::string*>(out)->append(static_cast<const char*>(data), n);
  return static_cast<la_ssize_t>(n);
}

}  // namespace

std::string tar_gz(const std::vector<archive_entry>& entries, std::time_t mtime) {
  archive_ptr a(archive_write_new(), &archive_write_free);
  if (!a) throw core::error("tar: archive_write_new failed");
  if (archive_write_set_format_ustar(a.get()) != ARCHIVE_OK) fail(a.get(), "archive_write_set_format_ustar");
  if (archive_write_add_filter_gzip(a.get()) != ARCHIVE_OK) fail(a.get(), "archive_write_add_filter_gzip");
  if (archive_write_set_filter_option(a.get(), "gzip", "compression-level", "9") != ARCHIVE_OK)
    fail(a.get(), "archive_write_set_filter_option(gzip:compression-level=9)");
  // No timestamp or name in the gzip header: the same entries give the same bytes.
  if (archive_write_set_filter_option(a.get(), "gzip", "timestamp", nullptr) != ARCHIVE_OK)
    fail(a.get(), "archive_write_set_filter_option(gzip:!timestamp)");
  std::string out;
  if (archive_write_open(a.get(), &out, nullptr, append, nullptr) != ARCHIVE_OK) fail(a.get(), "archive_write_open");
  for (const auto& e : entries) {
    check_path(e.path);
    entry_ptr h(archive_entry_new(), &archive_entry_free);
    if (!h) throw core::error("tar: archive_entry_new failed");
    archive_entry_set_pathname(h.get(), (e.directory ? e.path + "/" : e.path).c_str());
    archive_entry_set_filetype(h.get(), e.directory ? AE_IFDIR : AE_IFREG);
    archive_entry_set_perm(h.get(), e.mode & 07777);
    archive_entry_set_size(h.get(), e.directory ? 0 : static_cast<la_int64_t>(e.data.size()));
    archive_entry_set_mtime(h.get(), mtime < 0 ? 0 : mtime, 0);
    archive_entry_set_uid(h.get(), 0);
    archive_entry_set_gid(h.get(), 0);
    archive_entry_set_uname(h.get(), archive_owner);
    archive_entry_set_gname(h.get(), archive_owner);
    // A path ustar cannot hold is refused here (ARCHIVE_FAILED), naming it.
    if (archive_write_header(a.get(), h.get()) != ARCHIVE_OK) fail(a.get(), "archive_write_header('" + e.path + "')");
    if (!e.directory && !e.data.empty() &&
        archive_write_data(a.get(), e.data.data(), e.data.size()) != static_cast<la_ssize_t>(e.data.size()))
      fail(a.get(), "archive_write_data('" + e.path + "')");
  }
  if (archive_write_close(a.get()) != ARCHIVE_OK) fail(a.get(), "archive_write_close");
  return out;
}

}  // namespace cleave::apps
