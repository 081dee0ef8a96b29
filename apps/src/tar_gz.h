// Writing startup kits: a POSIX ustar archive compressed with gzip, by libarchive (written to
// disk with core::write_file_atomically).
#pragma once

#include <ctime>
#include <string>
#include <vector>

namespace cleave::apps {

struct archive_entry {
  std::string path;  // relative, '/'-separated; a directory's without the trailing '/'
  std::string data;  // a file's bytes (empty for a directory)
  unsigned mode = 0644;
  bool directory = false;
};

// The owner the entries carry: user and group name "cleave", numeric ids 0. GNU tar run as root
// gives the files to a `cleave` user where one exists (the account a packaged node runs as),
// else to root; run as anyone else it makes them the extracting user's.
inline constexpr const char* archive_owner = "cleave";

// A gzip-compressed ustar archive of `entries`, in order, every one stamped `mtime`. Throws
// core::error for a bad path (absolute, or with an empty, "." or ".." part), one ustar cannot
// hold (over 255 bytes, or no split into a 155-byte prefix and a 100-byte name) or any other
// failure of libarchive (naming the call).
std::string tar_gz(const std::vector<archive_entry>& entries, std::time_t mtime);

}  // namespace cleave::apps
