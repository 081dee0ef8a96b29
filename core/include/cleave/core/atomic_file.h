// Files written whole or not at all (through PATH.tmp, fsync, rename), and read whole.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <string_view>

namespace cleave::core {

// Writes `bytes` to `path` with `mode` through `path`.tmp (fsync, rename): readers see the old
// file or the whole new one, never a part, and a failure leaves no temporary behind. Throws
// core::error naming the file and the reason.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes, mode_t mode);

// The whole content of a file; throws core::error "cannot read PATH" when it cannot be opened.
std::string read_file(const std::filesystem::path& path);

}  // namespace cleave::core
