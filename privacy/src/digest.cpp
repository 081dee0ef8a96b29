#include "cleave/privacy/digest.h"

#include <openssl/evp.h>

#include "cleave/core/error.h"

namespace cleave::privacy {

std::string sha256_hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr) != 1)
    throw core::error("EVP_Digest(SHA-256) failed");
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

}  // namespace cleave::privacy
