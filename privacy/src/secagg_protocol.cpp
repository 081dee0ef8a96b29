// The secure-aggregation round: a device's shares, masks and reveals, and the server's sum.
#include <openssl/err.h>
#include <openssl/evp.h>

#include <algorithm>
#include <memory>
#include <string>

#include "cleave/core/error.h"
#include "cleave/privacy/secagg.h"

namespace cleave::privacy {

namespace {

constexpr std::uint32_t no_point_id = 0xFFFFFFFFu;  // its Shamir point id + 1 would wrap to 0

std::uint32_t point_of(std::uint32_t id) {
  return id + 1;
}

std::string round_text(std::uint64_t round) {
  return "round " + std::to_string(round);
}

std::string pair_label(const char* kind, std::uint64_t round, std::uint32_t a, std::uint32_t b) {
  return std::string("cleave secagg ") + kind + " " + std::to_string(round) + " " + std::to_string(std::min(a, b)) +
         " " + std::to_string(std::max(a, b));
}
std::string mask_label(std::uint64_t round, std::uint32_t a, std::uint32_t b) {
  return pair_label("pair", round, a, b);
}
std::string seal_label(std::uint64_t round, std::uint32_t a, std::uint32_t b) {
  return pair_label("seal", round, a, b);
}

// The authenticated data of a sealed pair of shares: "round:from:to".
std::vector<std::uint8_t> seal_aad(std::uint64_t round, std::uint32_t from, std::uint32_t to) {
  const std::string s = std::to_string(round) + ":" + std::to_string(from) + ":" + std::to_string(to);
  return {s.begin(), s.end()};
}

// Roster rules shared by both sides: strictly increasing ids, none without a Shamir point, and
// 2 <= threshold <= size.
void check_roster(std::span<const roster_entry> roster, int threshold, const std::string& who) {
  for (std::size_t i = 0; i < roster.size(); ++i) {
    if (roster[i].id == no_point_id)
      throw core::error(who + ": device id " + std::to_string(no_point_id) + " is reserved and cannot be in a roster");
    if (i > 0 && roster[i].id <= roster[i - 1].id)
      throw core::error(who + ": the roster is not sorted by id without repeats (device " +
                        std::to_string(roster[i].id) + " follows " + std::to_string(roster[i - 1].id) + ")");
  }
  if (threshold < 2 || static_cast<std::size_t>(threshold) > roster.size())
    throw core::error(who + ": threshold " + std::to_string(threshold) + " is not in [2, " +
                      std::to_string(roster.size()) + "] (the roster size)");
}

const roster_entry* find_entry(std::span<const roster_entry> roster, std::uint32_t id) {
  const auto it = std::lower_bound(roster.begin(), roster.end(), id,
                                   [](const roster_entry& e, std::uint32_t v) { return e.id < v; });
  return it != roster.end() && it->id == id ? &*it : nullptr;
}

bool contains(std::span<const std::uint32_t> sorted, std::uint32_t id) {
  return std::binary_search(sorted.begin(), sorted.end(), id);
}

// The X25519 public key of a secret, to check a reconstructed mask key against the roster.
bytes32 public_of(const bytes32& secret) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, secret.data(), secret.size()), &EVP_PKEY_free);
  bytes32 pub{};
  std::size_t n = pub.size();
  if (!key || EVP_PKEY_get_raw_public_key(key.get(), pub.data(), &n) != 1 || n != pub.size()) {
    const unsigned long code = ERR_get_error();
    char buf[256] = "no reason given";
    if (code != 0) ERR_error_string_n(code, buf, sizeof buf);
    ERR_clear_error();
    throw core::error(std::string(key ? "EVP_PKEY_get_raw_public_key" : "EVP_PKEY_new_raw_private_key") +
                      "(X25519) failed: " + buf);
  }
  return pub;
}

}  // namespace

std::vector<std::uint8_t> keys_statement(std::uint64_t round, const roster_entry& e) {
  static constexpr std::string_view label = "cleave secagg round keys v1";
  std::vector<std::uint8_t> out(label.begin(), label.end());
  out.push_back(0);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(round >> (8 * i)));
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(e.id >> (8 * i)));
  out.insert(out.end(), e.mask_public.begin(), e.mask_public.end());
  out.insert(out.end(), e.encrypt_public.begin(), e.encrypt_public.end());
  return out;
}

int default_threshold(int n_devices) {
  return std::max(2, n_devices / 2 + 1);
}

// ---- device ----

secagg_client::secagg_client(std::uint32_t self, std::uint64_t round) : self_(self), round_(round) {
  if (self == no_point_id)
    throw core::error("secure aggregation: device id " + std::to_string(no_point_id) +
                      " is reserved (it has no Shamir point); use another id");
  mask_ = x25519_keypair();
  enc_ = x25519_keypair();
  seed_ = random_seed();
}

std::vector<addressed> secagg_client::share_keys(std::span<const roster_entry> roster, int threshold) {
  const std::string who = "device " + std::to_string(self_) + ", " + round_text(round_);
  if (!roster_.empty()) throw core::error(who + ": the shares were already made (share_keys runs once a round)");
  check_roster(roster, threshold, who);
  const roster_entry* me = find_entry(roster, self_);
  if (me == nullptr) throw core::error(who + ": the roster does not list this device");
  if (me->mask_public != mask_.public_key || me->encrypt_public != enc_.public_key)
    throw core::error(who + ": the roster carries other public keys for this device");

  std::vector<std::uint32_t> xs;
  xs.reserve(roster.size());
  for (const auto& e : roster) xs.push_back(point_of(e.id));
  const auto seed_shares = shamir_split(seed_, xs, threshold);
  const auto key_shares = shamir_split(mask_.secret, xs, threshold);

  std::vector<addressed> out;
  out.reserve(roster.size() - 1);
  for (std::size_t i = 0; i < roster.size(); ++i) {
    const roster_entry& v = roster[i];
    if (v.id == self_) continue;
    bytes32 key;
    try {
      key = agree(enc_.secret, v.encrypt_public, seal_label(round_, self_, v.id));
    } catch (const core::error& e) {
      throw core::error(who + ": no sealing key with device " + std::to_string(v.id) + ": " + e.what());
    }
    std::vector<std::uint8_t> plain = share_bytes(seed_shares[i]);
    const auto k = share_bytes(key_shares[i]);
    plain.insert(plain.end(), k.begin(), k.end());
    out.push_back({v.id, seal(key, plain, seal_aad(round_, self_, v.id))});
    std::fill(plain.begin(), plain.end(), std::uint8_t{0});
  }
  const std::size_t mine = static_cast<std::size_t>(me - roster.data());
  shares_[self_] = {seed_shares[mine], key_shares[mine]};
  roster_.assign(roster.begin(), roster.end());
  threshold_ = threshold;
  return out;
}

bool secagg_client::receive_share(std::uint32_t from, std::span<const std::uint8_t> sealed) {
  if (roster_.empty() || from == self_) return false;
  const roster_entry* sender = find_entry(roster_, from);
  if (sender == nullptr) return false;
  bytes32 key;
  try {
    key = agree(enc_.secret, sender->encrypt_public, seal_label(round_, from, self_));
  } catch (const core::error&) {
    return false;
  }
  const auto plain = open(key, sealed, seal_aad(round_, from, self_));
  if (!plain || plain->size() != 2 * share_size) return false;
  std::pair<share, share> got;
  try {
    got.first = share_from_bytes(std::span(*plain).first(share_size));
    got.second = share_from_bytes(std::span(*plain).subspan(share_size));
  } catch (const core::error&) {
    return false;
  }
  if (got.first.x != point_of(self_) || got.second.x != point_of(self_)) return false;
  const auto held = shares_.find(from);
  if (held != shares_.end())  // a repeat: accepted only when it carries the same shares
    return held->second.first.y == got.first.y && held->second.second.y == got.second.y;
  shares_[from] = got;
  return true;
}

void secagg_client::mask(std::span<std::uint64_t> words, std::span<const std::uint32_t> mask_set) {
  const std::string who = "device " + std::to_string(self_) + ", " + round_text(round_);
  if (roster_.empty()) throw core::error(who + ": cannot mask before the shares were made (share_keys)");
  if (!mask_set_.empty()) throw core::error(who + ": the upload was already masked (mask runs once a round)");
  for (std::size_t i = 1; i < mask_set.size(); ++i)
    if (mask_set[i] <= mask_set[i - 1])
      throw core::error(who + ": the mask set is not sorted by id without repeats (device " +
                        std::to_string(mask_set[i]) + " follows " + std::to_string(mask_set[i - 1]) + ")");
  if (!contains(mask_set, self_)) throw core::error(who + ": the mask set does not include this device");
  if (mask_set.size() < static_cast<std::size_t>(threshold_))
    throw core::error(who + ": the mask set has " + std::to_string(mask_set.size()) + " devices, fewer than the " +
                      std::to_string(threshold_) + " the threshold needs");
  for (const std::uint32_t v : mask_set)
    if (!has_share_from(v))
      throw core::error(who + ": the mask set names device " + std::to_string(v) +
                        ", whose shares this device does not hold");

  apply_mask(seed_, round_, words, true);
  for (const std::uint32_t v : mask_set) {
    if (v == self_) continue;
    const roster_entry* e = find_entry(roster_, v);
    bytes32 s;
    try {
      s = agree(mask_.secret, e->mask_public, mask_label(round_, self_, v));
    } catch (const core::error& err) {
      throw core::error(who + ": no pairwise mask with device " + std::to_string(v) + ": " + err.what());
    }
    apply_mask(s, round_, words, self_ < v);
  }
  mask_set_.assign(mask_set.begin(), mask_set.end());
}

std::vector<addressed> secagg_client::reveal(std::span<const std::uint32_t> survivors,
                                             std::span<const std::uint32_t> dropped) {
  const std::string who = "device " + std::to_string(self_) + ", " + round_text(round_);
  if (mask_set_.empty()) throw core::error(who + ": nothing to reveal before the upload was masked");
  std::vector<std::uint32_t> s(survivors.begin(), survivors.end()), d(dropped.begin(), dropped.end());
  std::sort(s.begin(), s.end());
  std::sort(d.begin(), d.end());
  for (const auto* list : {&s, &d}) {
    const char* kind = list == &s ? "survivor" : "dropped";
    for (std::size_t i = 0; i < list->size(); ++i) {
      const std::uint32_t id = (*list)[i];
      if (i > 0 && id == (*list)[i - 1])
        throw core::error(who + ": the reveal request names device " + std::to_string(id) + " twice as " + kind);
      if (!contains(mask_set_, id))
        throw core::error(who + ": the reveal request names device " + std::to_string(id) + " as " + kind +
                          ", but it was not in the mask set");
    }
  }
  for (const std::uint32_t id : d) {
    if (id == self_) throw core::error(who + ": the reveal request names this device as dropped");
    if (std::binary_search(s.begin(), s.end(), id))
      throw core::error(who + ": the reveal request names device " + std::to_string(id) +
                        " both survivor and dropped (its input would be exposed); refused");
  }
  // A share this device must never reveal is erased (x = 0) once the other kind was revealed, so
  // a later request naming the device the other way is refused as well.
  for (const std::uint32_t id : s) {
    const auto it = shares_.find(id);
    if (it == shares_.end()) throw core::error(who + ": holds no share of device " + std::to_string(id));
    if (it->second.first.x == 0)
      throw core::error(who + ": device " + std::to_string(id) +
                        " was named dropped in an earlier reveal request; refused to name it survivor now");
  }
  for (const std::uint32_t id : d) {
    const auto it = shares_.find(id);
    if (it == shares_.end()) throw core::error(who + ": holds no share of device " + std::to_string(id));
    if (it->second.second.x == 0)
      throw core::error(who + ": device " + std::to_string(id) +
                        " was named survivor in an earlier reveal request; refused to name it dropped now");
  }
  std::vector<addressed> out;
  out.reserve(s.size() + d.size());
  for (const std::uint32_t id : s) {
    auto& held = shares_.at(id);
    out.push_back({id, share_bytes(held.first)});
    held.second = share{};
  }
  for (const std::uint32_t id : d) {
    auto& held = shares_.at(id);
    out.push_back({id, share_bytes(held.second)});
    held.first = share{};
  }
  return out;
}

// ---- server ----

secagg_server::secagg_server(std::uint64_t round, std::vector<roster_entry> roster, int threshold)
    : round_(round), roster_(std::move(roster)), threshold_(threshold) {
  check_roster(roster_, threshold_, "secure aggregation server, " + round_text(round_));
}

void secagg_server::set_mask_set(std::vector<std::uint32_t> ids, std::size_t n_words) {
  const std::string who = "secure aggregation server, " + round_text(round_);
  if (!mask_set_.empty()) throw core::error(who + ": the mask set was already named");
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0 && ids[i] <= ids[i - 1])
      throw core::error(who + ": the mask set is not sorted by id without repeats (device " + std::to_string(ids[i]) +
                        " follows " + std::to_string(ids[i - 1]) + ")");
    if (find_entry(roster_, ids[i]) == nullptr)
      throw core::error(who + ": the mask set names device " + std::to_string(ids[i]) + ", which is not in the roster");
  }
  if (ids.size() < static_cast<std::size_t>(threshold_))
    throw core::error(who + ": the mask set has " + std::to_string(ids.size()) + " devices, fewer than the threshold " +
                      std::to_string(threshold_));
  mask_set_ = std::move(ids);
  n_words_ = n_words;
  sum_.assign(n_words, 0);
}

void secagg_server::add_upload(std::uint32_t id, std::span<const std::uint64_t> words) {
  const std::string who = "secure aggregation server, " + round_text(round_);
  if (mask_set_.empty()) throw core::error(who + ": upload from device " + std::to_string(id) + " before the mask set");
  if (!contains(mask_set_, id))
    throw core::error(who + ": upload from device " + std::to_string(id) + ", which is not in the mask set");
  if (uploaded_.count(id) > 0) throw core::error(who + ": a second upload from device " + std::to_string(id));
  if (!revealers_.empty())
    throw core::error(who + ": upload from device " + std::to_string(id) + " arrived after unmasking began");
  if (words.size() != n_words_)
    throw core::error(who + ": upload from device " + std::to_string(id) + " has " + std::to_string(words.size()) +
                      " words, not " + std::to_string(n_words_));
  for (std::size_t i = 0; i < n_words_; ++i) sum_[i] += words[i];
  uploaded_[id] = true;
}

std::vector<std::uint32_t> secagg_server::survivors() const {
  std::vector<std::uint32_t> out;
  for (const auto& [id, up] : uploaded_)
    if (up) out.push_back(id);
  return out;
}

std::vector<std::uint32_t> secagg_server::dropped() const {
  std::vector<std::uint32_t> out;
  for (const std::uint32_t id : mask_set_)
    if (uploaded_.count(id) == 0) out.push_back(id);
  return out;
}

void secagg_server::add_reveal(std::uint32_t from, std::span<const addressed> shares) {
  const std::string who = "secure aggregation server, " + round_text(round_);
  if (uploaded_.count(from) == 0)
    throw core::error(who + ": shares revealed by device " + std::to_string(from) + ", which is not a survivor");
  if (revealers_.count(from) > 0) throw core::error(who + ": a second reveal from device " + std::to_string(from));
  const auto in_mask_set = [&](std::uint32_t id) { return contains(mask_set_, id); };
  std::vector<std::pair<std::uint32_t, share>> got;
  got.reserve(shares.size());
  for (const addressed& a : shares) {
    if (!in_mask_set(a.id))
      throw core::error(who + ": device " + std::to_string(from) + " revealed a share of device " +
                        std::to_string(a.id) + ", which is not in the mask set");
    for (const auto& [owner, _] : got)
      if (owner == a.id)
        throw core::error(who + ": device " + std::to_string(from) + " revealed two shares of device " +
                          std::to_string(a.id));
    share s;
    try {
      s = share_from_bytes(a.bytes);
    } catch (const core::error& e) {
      throw core::error(who + ": device " + std::to_string(from) + " revealed for device " + std::to_string(a.id) +
                        " bytes that are not a share: " + e.what());
    }
    if (s.x != point_of(from))
      throw core::error(who + ": device " + std::to_string(from) + " revealed for device " + std::to_string(a.id) +
                        " a share that is not at its own point");
    got.emplace_back(a.id, s);
  }
  for (auto& [owner, s] : got) revealed_[owner].push_back(s);
  revealers_[from] = true;
}

bool secagg_server::can_unmask() const {
  if (mask_set_.empty() || uploaded_.empty()) return false;
  for (const std::uint32_t id : mask_set_) {
    const auto it = revealed_.find(id);
    if (it == revealed_.end() || it->second.size() < static_cast<std::size_t>(threshold_)) return false;
  }
  return true;
}

std::vector<std::uint64_t> secagg_server::unmask() const {
  const std::string who = "secure aggregation server, " + round_text(round_);
  if (mask_set_.empty()) throw core::error(who + ": cannot unmask before the mask set was named");
  if (uploaded_.empty()) throw core::error(who + ": cannot unmask without any upload");
  const auto shares_of = [&](std::uint32_t id, const char* what) -> std::span<const share> {
    const auto it = revealed_.find(id);
    const std::size_t have = it == revealed_.end() ? 0 : it->second.size();
    if (have < static_cast<std::size_t>(threshold_))
      throw core::error(who + ": device " + std::to_string(id) + ": only " + std::to_string(have) + " of the " +
                        std::to_string(threshold_) + " shares of its " + what + " were revealed");
    return it->second;
  };
  const auto combine = [&](std::uint32_t id, const char* what) {
    const auto shares = shares_of(id, what);
    try {
      return shamir_combine(shares, threshold_);
    } catch (const core::error& e) {
      throw core::error(who + ": device " + std::to_string(id) + ": the revealed shares of its " + what +
                        " are inconsistent: " + e.what());
    }
  };

  // Check every device's shares before any mask work, so a failure names the culprit quickly.
  const auto surv = survivors();
  const auto drop = dropped();
  std::vector<bytes32> seeds, keys;
  for (const std::uint32_t s : surv) seeds.push_back(combine(s, "self-mask seed"));
  for (const std::uint32_t d : drop) {
    keys.push_back(combine(d, "mask key"));
    if (public_of(keys.back()) != find_entry(roster_, d)->mask_public)
      throw core::error(who + ": device " + std::to_string(d) +
                        ": the revealed shares of its mask key do not give its roster key (a dishonest reveal)");
  }

  std::vector<std::uint64_t> out = sum_;
  for (const bytes32& seed : seeds) apply_mask(seed, round_, out, false);
  for (std::size_t j = 0; j < drop.size(); ++j) {
    const std::uint32_t d = drop[j];
    for (const std::uint32_t v : surv) {
      // v added PRG(s_vd) when v < d and subtracted it when v > d: undo that.
      bytes32 s;
      try {
        s = agree(keys[j], find_entry(roster_, v)->mask_public, mask_label(round_, v, d));
      } catch (const core::error& e) {
        throw core::error(who + ": no pairwise mask between devices " + std::to_string(v) + " and " +
                          std::to_string(d) + ": " + e.what());
      }
      apply_mask(s, round_, out, v > d);
    }
  }
  return out;
}

}  // namespace cleave::privacy
