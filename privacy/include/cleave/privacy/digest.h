// SHA-256 as lowercase hex: what pins a model a device agrees to train (`cleave agent
// --allow-model`).
#pragma once

#include <string>
#include <string_view>

namespace cleave::privacy {

// Throws core::error naming the OpenSSL call that failed.
std::string sha256_hex(std::string_view data);

}  // namespace cleave::privacy
