// Secure aggregation of device replicas, after Bonawitz et al. (CCS'17): every device masks its
// fixed-point upload with pairwise masks that cancel in the sum and with a self mask, and
// secret-shares both seeds (Shamir) among the round's devices, so the server learns only the sum
// and still recovers it when devices drop out after masking.
//
// One round, as the server drives it:
//   1. keys:     each device makes fresh X25519 key pairs (mask, encryption) for the round and
//                sends the public halves; the server sends the roster (ids + keys) to all.
//   2. shares:   each device splits its self-mask seed and its mask secret key into Shamir
//                shares (threshold t), seals share v for device v (AES-256-GCM, key agreed by
//                X25519), and the server forwards them; a device missing shares is not masked with.
//   3. masking:  the server names the mask set (devices that trained and shared); each uploads
//                to_fixed(weight * value) plus its self mask plus, for every other member v,
//                +-PRG(s_uv) (sign by id order), all mod 2^64.
//   4. unmask:   the server names survivors (uploaded) and dropped (in the mask set, no upload);
//                each survivor reveals its shares of the survivors' self seeds and of the dropped
//                devices' mask secret keys; with t of each the server removes every mask.
// The server never gets both kinds of share for one device: an honest device refuses a request
// naming a device both ways.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace cleave::privacy {

using bytes32 = std::array<std::uint8_t, 32>;

struct keypair {
  bytes32 secret{};
  bytes32 public_key{};
};
// A fresh X25519 key pair from the OpenSSL RNG. Errors (core::error) name the failing call.
keypair x25519_keypair();
// 32 bytes from the OpenSSL RNG.
bytes32 random_seed();
// X25519(secret, peer_public) passed through HKDF-SHA256 with `label` as info. Throws core::error
// naming the failing call, or when the peer key is a low-order point (all-zero shared secret).
bytes32 agree(const bytes32& secret, const bytes32& peer_public, std::string_view label);

// Shamir's secret sharing of 32 bytes over GF(2^61 - 1): the secret as five field elements
// (56 bits each, the last 32), one random polynomial of degree threshold-1 per element.
struct share {
  std::uint32_t x = 0;  // the holder's point (never 0)
  std::array<std::uint64_t, 5> y{};
};
inline constexpr std::size_t share_size = 4 + 5 * 8;  // bytes of share_bytes
// One share per x (distinct, non-zero); 1 <= threshold <= xs.size(), else core::error.
std::vector<share> shamir_split(const bytes32& secret, std::span<const std::uint32_t> xs, int threshold);
// The secret from >= threshold shares with distinct non-zero x (the first threshold are used).
// Throws core::error when there are too few, an x repeats or is 0, a y is outside the field, or
// the result does not decode to 32 bytes (shares of different secrets).
bytes32 shamir_combine(std::span<const share> shares, int threshold);
std::vector<std::uint8_t> share_bytes(const share& s);
// Throws core::error unless `b` is share_size bytes holding a non-zero x and field elements.
share share_from_bytes(std::span<const std::uint8_t> b);

// AES-256-GCM: 12-byte random nonce || ciphertext || 16-byte tag; aad is authenticated, not sent.
std::vector<std::uint8_t> seal(const bytes32& key, std::span<const std::uint8_t> plain,
                               std::span<const std::uint8_t> aad);
// The plaintext, or nullopt when the bytes were not sealed with this key and aad (or are cut).
std::optional<std::vector<std::uint8_t>> open(const bytes32& key, std::span<const std::uint8_t> sealed,
                                              std::span<const std::uint8_t> aad);

// Fixed point in Z_2^64: value * 2^fraction_bits rounded, two's complement. |value| must be below
// max_fixed_magnitude so that sums of up to 1024 uploads cannot wrap; to_fixed throws core::error
// for a value beyond it or not finite.
inline constexpr int fraction_bits = 24;
inline constexpr double max_fixed_magnitude = 536870912.0;  // 2^(63 - 24 - 10)
std::uint64_t to_fixed(double value);
double from_fixed(std::uint64_t word);

// Adds (add) or subtracts the pseudorandom words of (seed, round) to v, mod 2^64: an AES-256-CTR
// keystream under HKDF-SHA256(seed, "cleave secagg stream" || round).
void apply_mask(const bytes32& seed, std::uint64_t round, std::span<std::uint64_t> v, bool add);

struct roster_entry {
  std::uint32_t id = 0;
  bytes32 mask_public{};
  bytes32 encrypt_public{};
  // The device's certificate (DER) and its signature over keys_statement(round, *this), so that
  // any member can tell the keys are the device's whoever relayed them.
  std::vector<std::uint8_t> certificate = {}, signature = {};
};
// What a device signs of its round keys: a label, the round, its id and both public keys.
std::vector<std::uint8_t> keys_statement(std::uint64_t round, const roster_entry& e);
// A sealed share (or a revealed one) and the device it is addressed to / belongs to.
struct addressed {
  std::uint32_t id = 0;
  std::vector<std::uint8_t> bytes;
};

// The smallest threshold that keeps a majority of the roster honest: floor(n / 2) + 1, at least 2.
int default_threshold(int n_devices);

// One device's part in one round.
class secagg_client {
 public:
  secagg_client(std::uint32_t self, std::uint64_t round);

  std::uint32_t self() const { return self_; }
  std::uint64_t round() const { return round_; }
  bytes32 mask_public() const { return mask_.public_key; }
  bytes32 encrypt_public() const { return enc_.public_key; }

  // Phase 2. Throws core::error when the roster is not sorted by id without repeats, lacks this
  // device or carries other keys for it, or 2 <= threshold <= roster size does not hold. Returns
  // one sealed pair of shares (self seed, mask key) for every other member.
  std::vector<addressed> share_keys(std::span<const roster_entry> roster, int threshold);
  // A sealed pair of shares from roster member `from`; false (nothing kept) when it does not
  // open: forged, replayed from another round or pair, or from outside the roster.
  bool receive_share(std::uint32_t from, std::span<const std::uint8_t> sealed);
  bool has_share_from(std::uint32_t id) const { return shares_.count(id) > 0; }

  // Phase 3: masks the fixed-point words in place for the mask set (sorted ids; this device and
  // only members whose shares it holds). Throws core::error otherwise.
  void mask(std::span<std::uint64_t> words, std::span<const std::uint32_t> mask_set);

  // Phase 4: shares of the survivors' self seeds and of the dropped devices' mask keys (its own
  // among them). Throws core::error when a device is named both ways, this device is named
  // dropped, an id was not in its mask set, or it holds no share of a named device.
  std::vector<addressed> reveal(std::span<const std::uint32_t> survivors, std::span<const std::uint32_t> dropped);

 private:
  std::uint32_t self_;
  std::uint64_t round_;
  keypair mask_, enc_;
  bytes32 seed_;
  std::vector<roster_entry> roster_;
  int threshold_ = 0;
  std::map<std::uint32_t, std::pair<share, share>> shares_;  // id -> (its seed, its mask key)
  std::vector<std::uint32_t> mask_set_;
};

// The server's part in one round: the roster, the sum of the masked uploads, the revealed shares,
// and the unmasked sum.
class secagg_server {
 public:
  // Throws core::error for a roster not sorted by id, with repeats, or a threshold out of range.
  secagg_server(std::uint64_t round, std::vector<roster_entry> roster, int threshold);

  const std::vector<roster_entry>& roster() const { return roster_; }
  int threshold() const { return threshold_; }
  // Sorted ids, all in the roster; throws core::error otherwise or when fewer than threshold.
  void set_mask_set(std::vector<std::uint32_t> ids, std::size_t n_words);
  const std::vector<std::uint32_t>& mask_set() const { return mask_set_; }
  // A masked upload of a member (n_words words); throws core::error for a non-member, a repeat
  // or a wrong length.
  void add_upload(std::uint32_t id, std::span<const std::uint64_t> words);
  std::vector<std::uint32_t> survivors() const;  // uploaded, sorted
  std::vector<std::uint32_t> dropped() const;    // in the mask set, not uploaded, sorted
  // The shares one survivor revealed (as secagg_client::reveal returns them); throws core::error
  // for a sender that is not a survivor, a repeat, or bytes that are not a share.
  void add_reveal(std::uint32_t from, std::span<const addressed> shares);
  // True when threshold shares are in for every survivor and every dropped device.
  bool can_unmask() const;
  // The sum of the survivors' unmasked uploads (fixed-point words). Throws core::error naming
  // the device whose shares are missing or inconsistent.
  std::vector<std::uint64_t> unmask() const;

 private:
  std::uint64_t round_;
  std::vector<roster_entry> roster_;
  int threshold_;
  std::vector<std::uint32_t> mask_set_;
  std::size_t n_words_ = 0;
  std::vector<std::uint64_t> sum_;
  std::map<std::uint32_t, bool> uploaded_;
  std::map<std::uint32_t, std::vector<share>> revealed_;  // owner -> shares
  std::map<std::uint32_t, bool> revealers_;
};

}  // namespace cleave::privacy
