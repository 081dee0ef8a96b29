// The primitives of secure aggregation: X25519 agreement, Shamir's secret sharing over
// GF(2^61 - 1), AES-256-GCM sealing, fixed-point words and AES-256-CTR masks.
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "cleave/core/error.h"
#include "cleave/privacy/secagg.h"

namespace cleave::privacy {

namespace {

// ---- OpenSSL plumbing ----

// The error for a failed OpenSSL call, with the reason OpenSSL queued (the queue is cleared).
core::error openssl_error(const char* call) {
  const unsigned long code = ERR_get_error();
  std::string reason = "no reason given";
  if (code != 0) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof buf);
    reason = buf;
  }
  ERR_clear_error();
  return core::error(std::string(call) + " failed: " + reason);
}

struct pkey_free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct pkey_ctx_free {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
struct cipher_ctx_free {
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
};
struct kdf_ctx_free {
  void operator()(EVP_KDF_CTX* p) const { EVP_KDF_CTX_free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_free>;
using pkey_ctx_ptr = std::unique_ptr<EVP_PKEY_CTX, pkey_ctx_free>;
using cipher_ctx_ptr = std::unique_ptr<EVP_CIPHER_CTX, cipher_ctx_free>;
using kdf_ctx_ptr = std::unique_ptr<EVP_KDF_CTX, kdf_ctx_free>;

// Algorithms are fetched once per process and kept for its lifetime (freeing them during exit
// would race OpenSSL's own cleanup).
const EVP_CIPHER* fetch_cipher(const char* name) {
  EVP_CIPHER* c = EVP_CIPHER_fetch(nullptr, name, nullptr);
  if (c == nullptr) throw openssl_error((std::string("EVP_CIPHER_fetch(") + name + ")").c_str());
  return c;
}
const EVP_CIPHER* aes_256_gcm() {
  static const EVP_CIPHER* c = fetch_cipher("AES-256-GCM");
  return c;
}
const EVP_CIPHER* aes_256_ctr() {
  static const EVP_CIPHER* c = fetch_cipher("AES-256-CTR");
  return c;
}
EVP_KDF* hkdf_kdf() {
  static EVP_KDF* k = [] {
    EVP_KDF* f = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
    if (f == nullptr) throw openssl_error("EVP_KDF_fetch(HKDF)");
    return f;
  }();
  return k;
}

// HKDF-SHA256 (no salt) of ikm with info, 32 bytes out.
bytes32 hkdf_sha256(std::span<const std::uint8_t> ikm, std::span<const std::uint8_t> info) {
  kdf_ctx_ptr ctx(EVP_KDF_CTX_new(hkdf_kdf()));
  if (!ctx) throw openssl_error("EVP_KDF_CTX_new");
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<std::uint8_t*>(ikm.data()), ikm.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<std::uint8_t*>(info.data()), info.size()),
      OSSL_PARAM_construct_end()};
  bytes32 out{};
  if (EVP_KDF_derive(ctx.get(), out.data(), out.size(), params) != 1) throw openssl_error("EVP_KDF_derive(HKDF)");
  return out;
}

void fill_random(void* p, std::size_t n) {
  if (RAND_bytes(static_cast<unsigned char*>(p), static_cast<int>(n)) != 1) throw openssl_error("RAND_bytes");
}

// ---- little-endian words ----

std::uint64_t load_le64(const std::uint8_t* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}
void store_le64(std::uint8_t* p, std::uint64_t v) {
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  std::memcpy(p, &v, 8);
}

// ---- GF(2^61 - 1) ----

constexpr std::uint64_t prime = (std::uint64_t{1} << 61) - 1;

std::uint64_t reduce(std::uint64_t a) {  // a < 2^64 -> a mod p
  a = (a & prime) + (a >> 61);
  return a >= prime ? a - prime : a;
}
std::uint64_t add_mod(std::uint64_t a, std::uint64_t b) {  // a, b < p
  const std::uint64_t s = a + b;
  return s >= prime ? s - prime : s;
}
std::uint64_t sub_mod(std::uint64_t a, std::uint64_t b) {
  return a >= b ? a - b : a + prime - b;
}
std::uint64_t mul_mod(std::uint64_t a, std::uint64_t b) {                // a, b < p
  const unsigned __int128 prod = static_cast<unsigned __int128>(a) * b;  // < 2^122
  const std::uint64_t lo = static_cast<std::uint64_t>(prod) & prime;
  const std::uint64_t hi = static_cast<std::uint64_t>(prod >> 61);  // < 2^61
  return reduce(lo + hi);
}
std::uint64_t pow_mod(std::uint64_t base, std::uint64_t e) {
  std::uint64_t r = 1;
  while (e != 0) {
    if (e & 1) r = mul_mod(r, base);
    base = mul_mod(base, base);
    e >>= 1;
  }
  return r;
}
std::uint64_t inv_mod(std::uint64_t a) {
  return pow_mod(a, prime - 2);
}  // a != 0 (Fermat)

// A uniform field element: 61 random bits, the one value equal to p rejected.
std::uint64_t random_element() {
  for (;;) {
    std::uint64_t v;
    fill_random(&v, sizeof v);
    v &= prime;
    if (v < prime) return v;
  }
}

// The secret's five elements: bytes [0,7), [7,14), [14,21), [21,28) and [28,32), little-endian.
constexpr int n_elements = 5;
constexpr std::size_t chunk_offset[n_elements] = {0, 7, 14, 21, 28};
constexpr std::size_t chunk_length[n_elements] = {7, 7, 7, 7, 4};

std::array<std::uint64_t, n_elements> to_elements(const bytes32& secret) {
  std::array<std::uint64_t, n_elements> e{};
  for (int k = 0; k < n_elements; ++k)
    for (std::size_t b = 0; b < chunk_length[k]; ++b)
      e[k] |= static_cast<std::uint64_t>(secret[chunk_offset[k] + b]) << (8 * b);
  return e;
}

std::string fixed_value_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

// ---- X25519 ----

keypair x25519_keypair() {
  pkey_ctx_ptr ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr));
  if (!ctx) throw openssl_error("EVP_PKEY_CTX_new_id(X25519)");
  if (EVP_PKEY_keygen_init(ctx.get()) != 1) throw openssl_error("EVP_PKEY_keygen_init(X25519)");
  EVP_PKEY* raw = nullptr;
  if (EVP_PKEY_keygen(ctx.get(), &raw) != 1) throw openssl_error("EVP_PKEY_keygen(X25519)");
  pkey_ptr key(raw);
  keypair kp;
  std::size_t n = kp.secret.size();
  if (EVP_PKEY_get_raw_private_key(key.get(), kp.secret.data(), &n) != 1 || n != kp.secret.size())
    throw openssl_error("EVP_PKEY_get_raw_private_key(X25519)");
  n = kp.public_key.size();
  if (EVP_PKEY_get_raw_public_key(key.get(), kp.public_key.data(), &n) != 1 || n != kp.public_key.size())
    throw openssl_error("EVP_PKEY_get_raw_public_key(X25519)");
  return kp;
}

bytes32 random_seed() {
  bytes32 s{};
  fill_random(s.data(), s.size());
  return s;
}

bytes32 agree(const bytes32& secret, const bytes32& peer_public, std::string_view label) {
  pkey_ptr own(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, secret.data(), secret.size()));
  if (!own) throw openssl_error("EVP_PKEY_new_raw_private_key(X25519)");
  pkey_ptr peer(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peer_public.data(), peer_public.size()));
  if (!peer) throw openssl_error("EVP_PKEY_new_raw_public_key(X25519)");
  pkey_ctx_ptr ctx(EVP_PKEY_CTX_new(own.get(), nullptr));
  if (!ctx) throw openssl_error("EVP_PKEY_CTX_new(X25519)");
  if (EVP_PKEY_derive_init(ctx.get()) != 1) throw openssl_error("EVP_PKEY_derive_init(X25519)");
  if (EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) != 1) throw openssl_error("EVP_PKEY_derive_set_peer(X25519)");
  bytes32 shared{};
  std::size_t n = shared.size();
  if (EVP_PKEY_derive(ctx.get(), shared.data(), &n) != 1) {
    // OpenSSL refuses an all-zero result itself; say what that means for the caller.
    const core::error e = openssl_error("EVP_PKEY_derive(X25519)");
    throw core::error(std::string(e.what()) +
                      " (an all-zero shared secret is refused: the peer public key is a low-order point)");
  }
  if (n != shared.size()) throw core::error("EVP_PKEY_derive(X25519) returned " + std::to_string(n) + " bytes, not 32");
  const bytes32 zero{};
  if (CRYPTO_memcmp(shared.data(), zero.data(), shared.size()) == 0)
    throw core::error("X25519 agreement refused: an all-zero shared secret (the peer public key is a low-order point)");
  const bytes32 out = hkdf_sha256(shared, std::span(reinterpret_cast<const std::uint8_t*>(label.data()), label.size()));
  OPENSSL_cleanse(shared.data(), shared.size());
  return out;
}

// ---- Shamir over GF(2^61 - 1) ----

std::vector<share> shamir_split(const bytes32& secret, std::span<const std::uint32_t> xs, int threshold) {
  if (threshold < 1 || static_cast<std::size_t>(threshold) > xs.size())
    throw core::error("shamir_split: threshold " + std::to_string(threshold) + " is not in [1, " +
                      std::to_string(xs.size()) + "] (the number of holders)");
  std::vector<std::uint32_t> sorted(xs.begin(), xs.end());
  std::sort(sorted.begin(), sorted.end());
  if (sorted.front() == 0) throw core::error("shamir_split: a holder's point x is 0 (it would reveal the secret)");
  for (std::size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i] == sorted[i - 1])
      throw core::error("shamir_split: the point x = " + std::to_string(sorted[i]) + " is given twice");

  const auto elements = to_elements(secret);
  // coeffs[k][j]: coefficient of x^j of element k's polynomial; the constant term is the secret.
  std::vector<std::array<std::uint64_t, n_elements>> coeffs(static_cast<std::size_t>(threshold));
  coeffs[0] = elements;
  for (int j = 1; j < threshold; ++j)
    for (int k = 0; k < n_elements; ++k) coeffs[static_cast<std::size_t>(j)][k] = random_element();

  std::vector<share> out;
  out.reserve(xs.size());
  for (const std::uint32_t x : xs) {
    share s;
    s.x = x;
    for (int k = 0; k < n_elements; ++k) {
      std::uint64_t y = 0;  // Horner
      for (int j = threshold - 1; j >= 0; --j) y = add_mod(mul_mod(y, x), coeffs[static_cast<std::size_t>(j)][k]);
      s.y[k] = y;
    }
    out.push_back(s);
  }
  for (auto& c : coeffs) OPENSSL_cleanse(c.data(), sizeof c);
  return out;
}

bytes32 shamir_combine(std::span<const share> shares, int threshold) {
  if (threshold < 1) throw core::error("shamir_combine: threshold " + std::to_string(threshold) + " is below 1");
  if (shares.size() < static_cast<std::size_t>(threshold))
    throw core::error("shamir_combine: too few shares: " + std::to_string(shares.size()) + " of the " +
                      std::to_string(threshold) + " needed");
  for (std::size_t i = 0; i < shares.size(); ++i) {
    if (shares[i].x == 0) throw core::error("shamir_combine: a share has the point x = 0");
    for (const std::uint64_t y : shares[i].y)
      if (y >= prime)
        throw core::error("shamir_combine: the share at x = " + std::to_string(shares[i].x) +
                          " holds a value outside the field");
    for (std::size_t j = 0; j < i; ++j)
      if (shares[j].x == shares[i].x)
        throw core::error("shamir_combine: two shares have the point x = " + std::to_string(shares[i].x));
  }
  const auto t = static_cast<std::size_t>(threshold);
  // Lagrange basis at 0: l_j = prod_{m != j} x_m / (x_m - x_j).
  std::vector<std::uint64_t> basis(t);
  for (std::size_t j = 0; j < t; ++j) {
    std::uint64_t num = 1, den = 1;
    for (std::size_t m = 0; m < t; ++m) {
      if (m == j) continue;
      num = mul_mod(num, shares[m].x);
      den = mul_mod(den, sub_mod(shares[m].x, shares[j].x));
    }
    basis[j] = mul_mod(num, inv_mod(den));
  }
  std::array<std::uint64_t, n_elements> e{};
  for (int k = 0; k < n_elements; ++k)
    for (std::size_t j = 0; j < t; ++j) e[k] = add_mod(e[k], mul_mod(shares[j].y[k], basis[j]));

  bytes32 secret{};
  for (int k = 0; k < n_elements; ++k) {
    if ((e[k] >> (8 * chunk_length[k])) != 0)
      throw core::error(
          "shamir_combine: the shares do not combine to a 32-byte secret (shares of different secrets, or altered)");
    for (std::size_t b = 0; b < chunk_length[k]; ++b)
      secret[chunk_offset[k] + b] = static_cast<std::uint8_t>(e[k] >> (8 * b));
  }
  return secret;
}

std::vector<std::uint8_t> share_bytes(const share& s) {
  std::vector<std::uint8_t> b(share_size);
  for (int i = 0; i < 4; ++i) b[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(s.x >> (8 * i));
  for (int k = 0; k < n_elements; ++k) store_le64(b.data() + 4 + 8 * k, s.y[k]);
  return b;
}

share share_from_bytes(std::span<const std::uint8_t> b) {
  if (b.size() != share_size)
    throw core::error("a Shamir share is " + std::to_string(share_size) + " bytes, got " + std::to_string(b.size()));
  share s;
  for (int i = 0; i < 4; ++i) s.x |= static_cast<std::uint32_t>(b[static_cast<std::size_t>(i)]) << (8 * i);
  if (s.x == 0) throw core::error("a Shamir share has the point x = 0");
  for (int k = 0; k < n_elements; ++k) {
    s.y[k] = load_le64(b.data() + 4 + 8 * k);
    if (s.y[k] >= prime)
      throw core::error("the Shamir share at x = " + std::to_string(s.x) + " holds a value outside the field");
  }
  return s;
}

// ---- AES-256-GCM ----

namespace {
constexpr std::size_t nonce_size = 12;
constexpr std::size_t tag_size = 16;
}  // namespace

std::vector<std::uint8_t> seal(const bytes32& key, std::span<const std::uint8_t> plain,
                               std::span<const std::uint8_t> aad) {
  std::vector<std::uint8_t> out(nonce_size + plain.size() + tag_size);
  fill_random(out.data(), nonce_size);
  cipher_ctx_ptr ctx(EVP_CIPHER_CTX_new());
  if (!ctx) throw openssl_error("EVP_CIPHER_CTX_new");
  if (EVP_EncryptInit_ex2(ctx.get(), aes_256_gcm(), key.data(), out.data(), nullptr) != 1)
    throw openssl_error("EVP_EncryptInit_ex2(AES-256-GCM)");
  int n = 0;
  if (!aad.empty() && EVP_EncryptUpdate(ctx.get(), nullptr, &n, aad.data(), static_cast<int>(aad.size())) != 1)
    throw openssl_error("EVP_EncryptUpdate(AES-256-GCM aad)");
  std::size_t done = 0;
  if (!plain.empty()) {
    if (EVP_EncryptUpdate(ctx.get(), out.data() + nonce_size, &n, plain.data(), static_cast<int>(plain.size())) != 1)
      throw openssl_error("EVP_EncryptUpdate(AES-256-GCM)");
    done = static_cast<std::size_t>(n);
  }
  if (EVP_EncryptFinal_ex(ctx.get(), out.data() + nonce_size + done, &n) != 1)
    throw openssl_error("EVP_EncryptFinal_ex(AES-256-GCM)");
  if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag_size),
                          out.data() + nonce_size + plain.size()) != 1)
    throw openssl_error("EVP_CIPHER_CTX_ctrl(GCM_GET_TAG)");
  return out;
}

std::optional<std::vector<std::uint8_t>> open(const bytes32& key, std::span<const std::uint8_t> sealed,
                                              std::span<const std::uint8_t> aad) {
  if (sealed.size() < nonce_size + tag_size) return std::nullopt;
  const std::size_t n_plain = sealed.size() - nonce_size - tag_size;
  cipher_ctx_ptr ctx(EVP_CIPHER_CTX_new());
  if (!ctx) return std::nullopt;
  if (EVP_DecryptInit_ex2(ctx.get(), aes_256_gcm(), key.data(), sealed.data(), nullptr) != 1) {
    ERR_clear_error();
    return std::nullopt;
  }
  std::vector<std::uint8_t> plain(n_plain);
  int n = 0;
  bool ok = true;
  if (!aad.empty()) ok = EVP_DecryptUpdate(ctx.get(), nullptr, &n, aad.data(), static_cast<int>(aad.size())) == 1;
  std::size_t done = 0;
  if (ok && n_plain > 0) {
    ok = EVP_DecryptUpdate(ctx.get(), plain.data(), &n, sealed.data() + nonce_size, static_cast<int>(n_plain)) == 1;
    done = static_cast<std::size_t>(n);
  }
  std::uint8_t tag[tag_size];
  std::memcpy(tag, sealed.data() + nonce_size + n_plain, tag_size);
  if (ok) ok = EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, static_cast<int>(tag_size), tag) == 1;
  std::uint8_t tail[16];
  if (ok) ok = EVP_DecryptFinal_ex(ctx.get(), done < n_plain ? plain.data() + done : tail, &n) == 1;
  if (!ok) {
    ERR_clear_error();
    OPENSSL_cleanse(plain.data(), plain.size());
    return std::nullopt;
  }
  return plain;
}

// ---- fixed point ----

std::uint64_t to_fixed(double value) {
  if (!std::isfinite(value)) throw core::error("to_fixed: the value " + fixed_value_text(value) + " is not finite");
  if (std::fabs(value) >= max_fixed_magnitude)
    throw core::error("to_fixed: the value " + fixed_value_text(value) +
                      " is outside the fixed-point range (|value| < " + fixed_value_text(max_fixed_magnitude) + ")");
  const long long q = std::llround(value * static_cast<double>(std::int64_t{1} << fraction_bits));
  return static_cast<std::uint64_t>(static_cast<std::int64_t>(q));
}

double from_fixed(std::uint64_t word) {
  return static_cast<double>(static_cast<std::int64_t>(word)) / static_cast<double>(std::int64_t{1} << fraction_bits);
}

// ---- masks ----

void apply_mask(const bytes32& seed, std::uint64_t round, std::span<std::uint64_t> v, bool add) {
  static constexpr char stream_label[] = "cleave secagg stream";
  std::array<std::uint8_t, sizeof stream_label - 1 + 8> info{};
  std::memcpy(info.data(), stream_label, sizeof stream_label - 1);
  store_le64(info.data() + sizeof stream_label - 1, round);
  bytes32 key = hkdf_sha256(seed, info);

  cipher_ctx_ptr ctx(EVP_CIPHER_CTX_new());
  if (!ctx) throw openssl_error("EVP_CIPHER_CTX_new");
  const std::uint8_t iv[16] = {};
  const int init = EVP_EncryptInit_ex2(ctx.get(), aes_256_ctr(), key.data(), iv, nullptr);
  OPENSSL_cleanse(key.data(), key.size());
  if (init != 1) throw openssl_error("EVP_EncryptInit_ex2(AES-256-CTR)");

  // The keystream in chunks: encrypting zeros in place gives it directly.
  constexpr std::size_t chunk_words = 2048;
  alignas(16) std::uint8_t stream[chunk_words * 8];
  for (std::size_t at = 0; at < v.size(); at += chunk_words) {
    const std::size_t words = std::min(chunk_words, v.size() - at);
    const int n_bytes = static_cast<int>(words * 8);
    std::memset(stream, 0, static_cast<std::size_t>(n_bytes));
    int n = 0;
    if (EVP_EncryptUpdate(ctx.get(), stream, &n, stream, n_bytes) != 1 || n != n_bytes)
      throw openssl_error("EVP_EncryptUpdate(AES-256-CTR)");
    std::uint64_t* out = v.data() + at;
    if (add) {
      for (std::size_t i = 0; i < words; ++i) out[i] += load_le64(stream + 8 * i);
    } else {
      for (std::size_t i = 0; i < words; ++i) out[i] -= load_le64(stream + 8 * i);
    }
  }
  OPENSSL_cleanse(stream, sizeof stream);
}

}  // namespace cleave::privacy
