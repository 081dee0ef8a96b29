// Secure aggregation: the primitives (X25519, Shamir, AES-GCM, fixed point, masks) and whole
// rounds: exact weighted means, dropouts, missing reveals, uniform uploads and refused input.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>

#include "../support/error_of.h"
#include "cleave/core/error.h"
#include "cleave/privacy/masked_replica.h"
#include "cleave/privacy/secagg.h"

using namespace cleave;
using namespace cleave::privacy;

namespace {

constexpr std::uint64_t field_prime = (std::uint64_t{1} << 61) - 1;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<std::uint8_t> text_bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

// ---- simulated devices ----

struct model {
  double samples = 0;  // the weight
  std::vector<float> values;
};

std::map<std::uint32_t, model> make_models(const std::vector<std::uint32_t>& ids, std::size_t n_values,
                                           std::uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::uniform_int_distribution<int> samples(10, 5000);
  std::map<std::uint32_t, model> out;
  for (const auto id : ids) {
    model m;
    m.samples = samples(g);
    m.values.resize(n_values);
    for (auto& v : m.values) v = value(g) * 0.5f + 0.1f;
    out[id] = std::move(m);
  }
  return out;
}

// Word 0: the weight; then weight * value for every value.
std::vector<std::uint64_t> encode(const model& m) {
  std::vector<std::uint64_t> w;
  w.reserve(m.values.size() + 1);
  w.push_back(to_fixed(m.samples));
  for (const float v : m.values) w.push_back(to_fixed(m.samples * static_cast<double>(v)));
  return w;
}

// max over values of |secure - plain| / max(|plain|, 1e-3) for the weighted mean of `included`.
double max_relative_error(const std::vector<std::uint64_t>& sum, const std::map<std::uint32_t, model>& models,
                          const std::vector<std::uint32_t>& included) {
  const std::size_t n = models.begin()->second.values.size();
  REQUIRE(sum.size() == n + 1);
  double plain_weight = 0;
  for (const auto id : included) plain_weight += models.at(id).samples;
  const double secure_weight = from_fixed(sum[0]);
  CHECK(std::fabs(secure_weight - plain_weight) < 1e-6);
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double plain = 0;
    for (const auto id : included) plain += models.at(id).samples * static_cast<double>(models.at(id).values[i]);
    plain /= plain_weight;
    const double secure = from_fixed(sum[i + 1]) / secure_weight;
    worst = std::max(worst, std::fabs(secure - plain) / std::max(std::fabs(plain), 1e-3));
  }
  return worst;
}

// The devices of one round after the key and share phases.
struct party {
  std::uint64_t round = 0;
  int threshold = 0;
  std::vector<secagg_client> clients;
  std::vector<roster_entry> roster;

  secagg_client& client(std::uint32_t id) {
    for (auto& c : clients)
      if (c.self() == id) return c;
    FAIL("no device " << id);
    return clients.front();
  }
};

party make_party(std::vector<std::uint32_t> ids, std::uint64_t round, int threshold) {
  std::sort(ids.begin(), ids.end());
  party p;
  p.round = round;
  p.threshold = threshold;
  for (const auto id : ids) p.clients.emplace_back(id, round);
  for (const auto& c : p.clients) p.roster.push_back({c.self(), c.mask_public(), c.encrypt_public()});
  std::vector<std::pair<std::uint32_t, std::vector<addressed>>> sent;
  for (auto& c : p.clients) sent.emplace_back(c.self(), c.share_keys(p.roster, threshold));
  for (const auto& [from, out] : sent) {
    CHECK(out.size() == ids.size() - 1);
    for (const auto& a : out) CHECK(p.client(a.id).receive_share(from, a.bytes));
  }
  for (auto& c : p.clients)
    for (const auto id : ids) CHECK(c.has_share_from(id));
  return p;
}

struct round_result {
  std::vector<std::uint64_t> sum;
  std::map<std::uint32_t, std::vector<std::uint64_t>> masked;  // as the server received them
};

// Masks every device's words for the whole party, uploads all but `dropped`, and has the first
// `n_reveals` survivors (all when negative) reveal. Returns the unmasked sum.
round_result run_round(party& p, secagg_server& server,
                       const std::map<std::uint32_t, std::vector<std::uint64_t>>& words,
                       const std::set<std::uint32_t>& dropped, int n_reveals = -1) {
  std::vector<std::uint32_t> mask_set;
  for (const auto& c : p.clients) mask_set.push_back(c.self());
  const std::size_t n_words = words.begin()->second.size();
  server.set_mask_set(mask_set, n_words);
  round_result r;
  for (auto& c : p.clients) {
    auto w = words.at(c.self());
    c.mask(w, mask_set);
    if (dropped.count(c.self()) > 0) continue;  // masked, never uploaded
    server.add_upload(c.self(), w);
    r.masked[c.self()] = std::move(w);
  }
  const auto survivors = server.survivors();
  const auto gone = server.dropped();
  CHECK(gone == std::vector<std::uint32_t>(dropped.begin(), dropped.end()));
  int revealed = 0;
  for (const auto id : survivors) {
    if (n_reveals >= 0 && revealed == n_reveals) break;
    server.add_reveal(id, p.client(id).reveal(survivors, gone));
    ++revealed;
  }
  REQUIRE(server.can_unmask());
  r.sum = server.unmask();
  return r;
}

std::map<std::uint32_t, std::vector<std::uint64_t>> encode_all(const std::map<std::uint32_t, model>& models) {
  std::map<std::uint32_t, std::vector<std::uint64_t>> out;
  for (const auto& [id, m] : models) out[id] = encode(m);
  return out;
}

// Chi-square statistic of the 256 byte values of the words (little-endian bytes).
double byte_chi_square(const std::vector<std::uint64_t>& words) {
  std::array<double, 256> count{};
  for (const auto w : words)
    for (int b = 0; b < 8; ++b) count[(w >> (8 * b)) & 0xFF] += 1;
  const double expected = static_cast<double>(words.size() * 8) / 256.0;
  double chi = 0;
  for (const double c : count) chi += (c - expected) * (c - expected) / expected;
  return chi;
}

}  // namespace

TEST_CASE("x25519 agreement is symmetric, bound to its label, and refuses a low-order peer key") {
  const auto a = x25519_keypair(), b = x25519_keypair(), c = x25519_keypair();
  CHECK(a.public_key != b.public_key);
  CHECK(a.secret != a.public_key);
  const auto ab = agree(a.secret, b.public_key, "label one");
  CHECK(ab == agree(b.secret, a.public_key, "label one"));
  CHECK(ab != agree(b.secret, a.public_key, "label two"));
  CHECK(ab != agree(a.secret, c.public_key, "label one"));
  CHECK(random_seed() != random_seed());

  const bytes32 zero{};
  const auto e = testing::error_of([&] { agree(a.secret, zero, "x"); });
  CHECK(has(e, "low-order"));
  bytes32 one{};  // u = 1 is also of small order
  one[0] = 1;
  CHECK(has(testing::error_of([&] { agree(a.secret, one, "x"); }), "low-order"));
}

TEST_CASE("Shamir: any threshold of the shares recovers the secret, fewer or mixed ones do not") {
  const bytes32 secret = random_seed();
  const std::vector<std::uint32_t> xs = {1, 4, 8, 21, 100, 0xFFFFFFFEu, 0xFFFFFFFFu};
  const int t = 4;
  const auto shares = shamir_split(secret, xs, t);
  REQUIRE(shares.size() == xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) CHECK(shares[i].x == xs[i]);

  // Every subset of size t (35 of them), in a shuffled order.
  std::mt19937 g(7);
  int subsets = 0;
  for (unsigned mask = 0; mask < (1u << xs.size()); ++mask) {
    if (__builtin_popcount(mask) != t) continue;
    std::vector<share> pick;
    for (std::size_t i = 0; i < xs.size(); ++i)
      if (mask & (1u << i)) pick.push_back(shares[i]);
    std::shuffle(pick.begin(), pick.end(), g);
    CHECK(shamir_combine(pick, t) == secret);
    ++subsets;
  }
  CHECK(subsets == 35);
  CHECK(shamir_combine(shares, t) == secret);  // more than t: the first t are used

  // t - 1 shares are too few.
  const std::vector<share> few(shares.begin(), shares.begin() + t - 1);
  CHECK(has(testing::error_of([&] { shamir_combine(few, t); }), "too few"));
  // Combining t - 1 of them as if the threshold were t - 1 does not give the secret.
  {
    bool ok = false;
    try {
      ok = shamir_combine(few, t - 1) != secret;
    } catch (const core::error&) {
      ok = true;
    }
    CHECK(ok);
  }

  // Shares of two secrets mixed give neither.
  const bytes32 other = random_seed();
  const auto other_shares = shamir_split(other, xs, t);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<share> mixed = {shares[0], shares[1], other_shares[2], other_shares[3]};
    std::shuffle(mixed.begin(), mixed.end(), g);
    bool ok = false;
    try {
      const auto r = shamir_combine(mixed, t);
      ok = r != secret && r != other;
    } catch (const core::error& e) {
      ok = has(e.what(), "32-byte secret");
    }
    CHECK(ok);
  }

  // Threshold 1: every share alone is the secret.
  const auto ones = shamir_split(secret, xs, 1);
  for (const auto& s : ones) CHECK(shamir_combine(std::span(&s, 1), 1) == secret);

  // Bad split and combine arguments.
  CHECK(has(testing::error_of([&] { shamir_split(secret, xs, 0); }), "threshold 0"));
  CHECK(has(testing::error_of([&] { shamir_split(secret, xs, 8); }), "threshold 8"));
  const std::vector<std::uint32_t> with_zero = {1, 0, 3};
  CHECK(has(testing::error_of([&] { shamir_split(secret, with_zero, 2); }), "x is 0"));
  const std::vector<std::uint32_t> repeat = {1, 5, 5};
  CHECK(has(testing::error_of([&] { shamir_split(secret, repeat, 2); }), "x = 5"));
  std::vector<share> dup = {shares[0], shares[1], shares[1], shares[2]};
  CHECK(has(testing::error_of([&] { shamir_combine(dup, t); }), "two shares"));

  // Wire form: 44 bytes, x LE then five u64 LE.
  const auto b = share_bytes(shares[2]);
  REQUIRE(b.size() == share_size);
  CHECK(share_size == 44);
  CHECK(b[0] == 8);
  CHECK(b[1] == 0);
  const auto back = share_from_bytes(b);
  CHECK(back.x == shares[2].x);
  CHECK(back.y == shares[2].y);
  CHECK(has(testing::error_of([&] { share_from_bytes(std::span(b).first(43)); }), "44 bytes, got 43"));
  auto longer = b;
  longer.push_back(0);
  CHECK(has(testing::error_of([&] { share_from_bytes(longer); }), "got 45"));
  auto zero_x = b;
  std::fill(zero_x.begin(), zero_x.begin() + 4, std::uint8_t{0});
  CHECK(has(testing::error_of([&] { share_from_bytes(zero_x); }), "x = 0"));
  auto big_y = b;
  for (int i = 0; i < 8; ++i) big_y[4 + 16 + i] = static_cast<std::uint8_t>(field_prime >> (8 * i));  // y[2] = p
  CHECK(has(testing::error_of([&] { share_from_bytes(big_y); }), "outside the field"));
  big_y[4 + 16] -= 1;  // p - 1 is a field element
  CHECK(share_from_bytes(big_y).y[2] == field_prime - 1);
  share outside = shares[0];
  outside.y[4] = field_prime;
  std::vector<share> with_outside = {outside, shares[1], shares[2], shares[3]};
  CHECK(has(testing::error_of([&] { shamir_combine(with_outside, t); }), "outside the field"));
}

TEST_CASE("seal and open: a round trip, and nothing for altered bytes, aad, key or length") {
  const bytes32 key = random_seed();
  const auto plain = text_bytes("the shares of device 7 for device 8");
  const auto aad = text_bytes("3:7:8");
  const auto sealed = seal(key, plain, aad);
  CHECK(sealed.size() == 12 + plain.size() + 16);
  CHECK(seal(key, plain, aad) != sealed);  // fresh nonce
  const auto opened = open(key, sealed, aad);
  REQUIRE(opened.has_value());
  CHECK(*opened == plain);

  for (const std::size_t at : {std::size_t{0}, std::size_t{11}, std::size_t{12}, std::size_t{20}, sealed.size() - 1}) {
    auto bad = sealed;
    bad[at] ^= 0x04;
    CHECK(!open(key, bad, aad).has_value());
  }
  CHECK(!open(key, sealed, text_bytes("3:7:9")).has_value());
  CHECK(!open(key, sealed, {}).has_value());
  CHECK(!open(random_seed(), sealed, aad).has_value());
  CHECK(!open(key, std::span(sealed).first(sealed.size() - 1), aad).has_value());
  CHECK(!open(key, std::span(sealed).first(27), aad).has_value());
  CHECK(!open(key, std::span(sealed).first(3), aad).has_value());
  CHECK(!open(key, {}, aad).has_value());

  // Empty plaintext and empty aad.
  const auto empty = seal(key, {}, {});
  CHECK(empty.size() == 28);
  const auto e = open(key, empty, {});
  REQUIRE(e.has_value());
  CHECK(e->empty());
}

TEST_CASE("fixed point: round trips within 2^-25, wraps for sums, refuses what does not fit") {
  std::mt19937 g(3);
  std::uniform_real_distribution<double> wide(-5e8, 5e8), narrow(-2.0, 2.0);
  double worst = 0;
  for (int i = 0; i < 20000; ++i) {
    const double v = i % 2 ? wide(g) : narrow(g);
    worst = std::max(worst, std::fabs(from_fixed(to_fixed(v)) - v));
  }
  MESSAGE("fixed-point round trip: max abs error " << worst);
  CHECK(worst <= std::ldexp(1.0, -25));
  CHECK(from_fixed(to_fixed(-1.5)) == -1.5);
  CHECK(to_fixed(-1.0) == static_cast<std::uint64_t>(-(std::int64_t{1} << 24)));
  CHECK(from_fixed(to_fixed(-1.5) + to_fixed(2.25)) == 0.75);
  CHECK(from_fixed(to_fixed(0.0)) == 0.0);
  CHECK(std::fabs(from_fixed(to_fixed(max_fixed_magnitude - 1)) - (max_fixed_magnitude - 1)) == 0.0);
  CHECK(from_fixed(to_fixed(-(max_fixed_magnitude - 1))) == -(max_fixed_magnitude - 1));

  CHECK(has(testing::error_of([] { to_fixed(std::numeric_limits<double>::quiet_NaN()); }), "nan"));
  CHECK(has(testing::error_of([] { to_fixed(std::numeric_limits<double>::infinity()); }), "inf"));
  CHECK(has(testing::error_of([] { to_fixed(-std::numeric_limits<double>::infinity()); }), "-inf"));
  CHECK(has(testing::error_of([] { to_fixed(1e12); }), "1000000000000"));
  CHECK(has(testing::error_of([] { to_fixed(-max_fixed_magnitude); }), "outside the fixed-point range"));
  CHECK(has(testing::error_of([] { to_fixed(max_fixed_magnitude); }), "outside the fixed-point range"));
}

TEST_CASE("masks: subtracting undoes adding, streams depend on seed and round, chunks agree") {
  const bytes32 seed = random_seed();
  std::vector<std::uint64_t> v(10007);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = i * 0x9E3779B97F4A7C15ull;
  const auto original = v;
  apply_mask(seed, 5, v, true);
  std::size_t same = 0;
  for (std::size_t i = 0; i < v.size(); ++i) same += v[i] == original[i];
  CHECK(same == 0);
  apply_mask(seed, 5, v, false);
  CHECK(v == original);

  std::vector<std::uint64_t> a(5000, 0), b(3000, 0), c(5000, 0), d(5000, 0);
  apply_mask(seed, 5, a, true);
  apply_mask(seed, 5, b, true);
  apply_mask(seed, 6, c, true);
  apply_mask(random_seed(), 5, d, true);
  CHECK(std::equal(b.begin(), b.end(), a.begin()));  // the same stream, whatever the length
  CHECK(a != c);
  CHECK(a != d);
  std::vector<std::uint64_t> neg(5000, 0);
  apply_mask(seed, 5, neg, false);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK_EQ(a[i] + neg[i], std::uint64_t{0});
  std::vector<std::uint64_t> none;
  apply_mask(seed, 5, none, true);  // nothing to do
  CHECK(default_threshold(1) == 2);
  CHECK(default_threshold(3) == 2);
  CHECK(default_threshold(4) == 3);
  CHECK(default_threshold(5) == 3);
  CHECK(default_threshold(10) == 6);
}

TEST_CASE("a round of 4 devices gives the exact weighted mean") {
  const std::vector<std::uint32_t> ids = {3, 7, 8, 20};
  const auto models = make_models(ids, 10000, 11);
  const int t = default_threshold(4);
  auto p = make_party(ids, 42, t);
  secagg_server server(42, p.roster, t);
  const auto r = run_round(p, server, encode_all(models), {});
  const double err = max_relative_error(r.sum, models, ids);
  MESSAGE("4 devices, no dropout: max relative error " << err);
  CHECK(err < 1e-5);
}

TEST_CASE("devices dropping after masking leave the mean of the others") {
  SUBCASE("1 of 4 drops") {
    const std::vector<std::uint32_t> ids = {3, 7, 8, 20};
    const auto models = make_models(ids, 10000, 12);
    auto p = make_party(ids, 9, 3);
    secagg_server server(9, p.roster, 3);
    const auto r = run_round(p, server, encode_all(models), {8});
    const double err = max_relative_error(r.sum, models, {3, 7, 20});
    MESSAGE("4 devices, device 8 dropped: max relative error " << err);
    CHECK(err < 1e-5);
  }
  SUBCASE("2 of 5 drop, threshold 3") {
    const std::vector<std::uint32_t> ids = {1, 2, 30, 31, 1000};
    const auto models = make_models(ids, 10000, 13);
    auto p = make_party(ids, 10, 3);
    secagg_server server(10, p.roster, 3);
    const auto r = run_round(p, server, encode_all(models), {1, 31});
    const double err = max_relative_error(r.sum, models, {2, 30, 1000});
    MESSAGE("5 devices, devices 1 and 31 dropped: max relative error " << err);
    CHECK(err < 1e-5);
  }
  SUBCASE("the lowest and the highest id drop") {
    const std::vector<std::uint32_t> ids = {0, 5, 6, 7, 0xFFFFFFFEu};
    const auto models = make_models(ids, 3000, 14);
    auto p = make_party(ids, 11, 3);
    secagg_server server(11, p.roster, 3);
    const auto r = run_round(p, server, encode_all(models), {0, 0xFFFFFFFEu});
    const double err = max_relative_error(r.sum, models, {5, 6, 7});
    MESSAGE("5 devices, devices 0 and 4294967294 dropped: max relative error " << err);
    CHECK(err < 1e-5);
  }
}

TEST_CASE("unmasking needs threshold reveals, not all of them") {
  const std::vector<std::uint32_t> ids = {3, 7, 8, 20};
  const auto models = make_models(ids, 2000, 15);
  const auto words = encode_all(models);
  SUBCASE("threshold reveals suffice") {
    auto p = make_party(ids, 1, 3);
    secagg_server server(1, p.roster, 3);
    const auto r = run_round(p, server, words, {}, 3);  // device 20 never reveals
    const double err = max_relative_error(r.sum, models, ids);
    MESSAGE("4 devices, 3 reveals: max relative error " << err);
    CHECK(err < 1e-5);
  }
  SUBCASE("with a dropout, threshold reveals suffice") {
    auto p = make_party(ids, 2, 2);
    secagg_server server(2, p.roster, 2);
    const auto r = run_round(p, server, words, {7}, 2);
    CHECK(max_relative_error(r.sum, models, {3, 8, 20}) < 1e-5);
  }
  SUBCASE("fewer than threshold reveals") {
    auto p = make_party(ids, 3, 3);
    secagg_server server(3, p.roster, 3);
    std::vector<std::uint32_t> mask_set = ids;
    server.set_mask_set(mask_set, words.begin()->second.size());
    for (auto& c : p.clients) {
      auto w = words.at(c.self());
      c.mask(w, mask_set);
      server.add_upload(c.self(), w);
    }
    CHECK(!server.can_unmask());
    const auto survivors = server.survivors();
    CHECK(survivors == ids);
    for (const auto id : {3u, 7u}) {
      server.add_reveal(id, p.client(id).reveal(survivors, {}));
      CHECK(!server.can_unmask());
    }
    const auto e = testing::error_of([&] { server.unmask(); });
    CHECK(has(e, "device 3"));
    CHECK(has(e, "only 2 of the 3"));
    server.add_reveal(20, p.client(20).reveal(survivors, {}));
    CHECK(server.can_unmask());
    CHECK(max_relative_error(server.unmask(), models, ids) < 1e-5);
  }
}

TEST_CASE("a masked upload looks uniform, and differs between rounds") {
  const std::vector<std::uint32_t> ids = {3, 7, 8, 20};
  const auto models = make_models(ids, 9999, 16);  // 10000 words with the weight
  const auto words = encode_all(models);

  auto p = make_party(ids, 100, 3);
  secagg_server server(100, p.roster, 3);
  const auto r = run_round(p, server, words, {});
  CHECK(max_relative_error(r.sum, models, ids) < 1e-5);

  const double masked_chi = byte_chi_square(r.masked.at(7));
  const double plain_chi = byte_chi_square(words.at(7));
  MESSAGE("byte chi-square (255 dof): masked upload " << masked_chi << ", unmasked words " << plain_chi);
  CHECK(masked_chi < 340);
  CHECK(plain_chi > 3400);

  // The same input masked in the next round.
  auto q = make_party(ids, 101, 3);
  secagg_server next(101, q.roster, 3);
  const auto s = run_round(q, next, words, {});
  CHECK(max_relative_error(s.sum, models, ids) < 1e-5);
  std::size_t same = 0;
  for (std::size_t i = 0; i < r.masked.at(7).size(); ++i) same += r.masked.at(7)[i] == s.masked.at(7)[i];
  CHECK(same == 0);
  CHECK(r.sum == s.sum);
}

TEST_CASE("devices refuse bad rosters, mask sets and reveal requests") {
  CHECK(has(testing::error_of([] { secagg_client(0xFFFFFFFFu, 1); }), "4294967295"));

  secagg_client a(1, 4), b(2, 4), c(3, 4);
  std::vector<roster_entry> roster;
  for (const auto* x : {&a, &b, &c}) roster.push_back({x->self(), x->mask_public(), x->encrypt_public()});
  auto unsorted = roster;
  std::swap(unsorted[0], unsorted[1]);
  CHECK(has(testing::error_of([&] { a.share_keys(unsorted, 2); }), "not sorted"));
  auto repeated = roster;
  repeated[1].id = 1;
  CHECK(has(testing::error_of([&] { a.share_keys(repeated, 2); }), "not sorted"));
  CHECK(has(testing::error_of([&] { a.share_keys(std::span(roster).subspan(1), 2); }), "does not list this device"));
  auto other_key = roster;
  other_key[0].mask_public = b.mask_public();
  CHECK(has(testing::error_of([&] { a.share_keys(other_key, 2); }), "other public keys"));
  CHECK(has(testing::error_of([&] { a.share_keys(roster, 1); }), "threshold 1"));
  CHECK(has(testing::error_of([&] { a.share_keys(roster, 4); }), "threshold 4"));
  auto reserved = roster;
  reserved.push_back({0xFFFFFFFFu, a.mask_public(), a.encrypt_public()});
  CHECK(has(testing::error_of([&] { a.share_keys(reserved, 2); }), "reserved"));

  std::vector<std::uint64_t> w(16, 1);
  const std::vector<std::uint32_t> all = {1, 2, 3};
  CHECK(has(testing::error_of([&] { a.mask(w, all); }), "before the shares"));

  const auto from_a = a.share_keys(roster, 2);
  const auto from_b = b.share_keys(roster, 2);
  const auto from_c = c.share_keys(roster, 2);
  CHECK(has(testing::error_of([&] { a.share_keys(roster, 2); }), "already"));
  // a has only b's shares: c cannot be in its mask set.
  REQUIRE(a.receive_share(2, from_b[0].bytes));
  const std::vector<std::uint32_t> with_c = {1, 2, 3}, a_b = {1, 2}, b_c = {2, 3}, backwards = {2, 1};
  CHECK(has(testing::error_of([&] { a.mask(w, with_c); }), "device 3, whose shares"));
  CHECK(has(testing::error_of([&] { a.mask(w, b_c); }), "does not include this device"));
  CHECK(has(testing::error_of([&] { a.mask(w, backwards); }), "not sorted"));
  CHECK(has(testing::error_of([&] { a.reveal(a_b, {}); }), "before the upload was masked"));
  a.mask(w, a_b);
  CHECK(has(testing::error_of([&] { a.mask(w, a_b); }), "already masked"));

  const std::vector<std::uint32_t> s1 = {1}, s2 = {2}, s3 = {3}, s12 = {1, 2}, none;
  const auto both = testing::error_of([&] { a.reveal(s12, s2); });
  CHECK(has(both, "device 2 both survivor and dropped"));
  CHECK(has(testing::error_of([&] { a.reveal(s2, s1); }), "this device as dropped"));
  CHECK(has(testing::error_of([&] { a.reveal(s3, none); }), "device 3 as survivor, but it was not in the mask set"));
  CHECK(has(testing::error_of([&] { a.reveal(s1, s3); }), "not in the mask set"));
  const std::vector<std::uint32_t> twice = {1, 1};
  CHECK(has(testing::error_of([&] { a.reveal(twice, none); }), "twice"));
  const auto ok = a.reveal(s1, s2);
  REQUIRE(ok.size() == 2);
  CHECK(ok[0].id == 1);
  CHECK(ok[1].id == 2);
  CHECK(share_from_bytes(ok[0].bytes).x == 2);  // a's own point (id 1 + 1)
  CHECK(a.reveal(s1, s2).size() == 2);          // the same request again
  // Named the other way in a later request: refused too.
  CHECK(has(testing::error_of([&] { a.reveal(s12, none); }), "device 2 was named dropped in an earlier"));
  (void)from_a;
  (void)from_c;
}

TEST_CASE("devices keep no share that is forged, tampered, misaddressed or from another round") {
  secagg_client a(1, 4), b(2, 4), c(3, 4);
  std::vector<roster_entry> roster;
  for (const auto* x : {&a, &b, &c}) roster.push_back({x->self(), x->mask_public(), x->encrypt_public()});
  CHECK(!b.receive_share(1, std::vector<std::uint8_t>(100, 1)));  // before share_keys
  const auto from_a = a.share_keys(roster, 2);
  b.share_keys(roster, 2);
  c.share_keys(roster, 2);
  REQUIRE(from_a.size() == 2);
  REQUIRE(from_a[0].id == 2);
  REQUIRE(from_a[1].id == 3);

  auto tampered = from_a[0].bytes;
  tampered[20] ^= 1;
  CHECK(!b.receive_share(1, tampered));
  CHECK(!b.has_share_from(1));
  CHECK(!b.receive_share(1, std::span(from_a[0].bytes).first(30)));
  CHECK(!b.receive_share(3, from_a[0].bytes));  // claimed from another sender
  CHECK(!b.receive_share(2, from_a[0].bytes));  // from itself
  CHECK(!b.receive_share(9, from_a[0].bytes));  // from outside the roster
  CHECK(!b.receive_share(1, from_a[1].bytes));  // sealed for c
  CHECK(!b.has_share_from(1));
  CHECK(b.receive_share(1, from_a[0].bytes));
  CHECK(b.receive_share(1, from_a[0].bytes));  // a repeat of the same shares
  CHECK(b.has_share_from(1));

  // The same devices in the next round: a share sealed for round 4 does not open in round 5.
  secagg_client a5(1, 5), b5(2, 5);
  std::vector<roster_entry> roster5;
  for (const auto* x : {&a5, &b5}) roster5.push_back({x->self(), x->mask_public(), x->encrypt_public()});
  b5.share_keys(roster5, 2);
  const auto from_a5 = a5.share_keys(roster5, 2);
  CHECK(!b5.receive_share(1, from_a[0].bytes));
  CHECK(!b5.has_share_from(1));
  CHECK(b5.receive_share(1, from_a5[0].bytes));
}

TEST_CASE("the server refuses bad rosters, uploads and reveals") {
  const std::vector<std::uint32_t> ids = {3, 7, 8, 20};
  auto p = make_party(ids, 6, 3);
  auto unsorted = p.roster;
  std::swap(unsorted[1], unsorted[2]);
  CHECK(has(testing::error_of([&] { secagg_server(6, unsorted, 3); }), "not sorted"));
  CHECK(has(testing::error_of([&] { secagg_server(6, p.roster, 5); }), "threshold 5"));
  CHECK(has(testing::error_of([&] { secagg_server(6, p.roster, 1); }), "threshold 1"));

  secagg_server server(6, p.roster, 3);
  const std::vector<std::uint64_t> words(64, 5);
  CHECK(has(testing::error_of([&] { server.add_upload(3, words); }), "before the mask set"));
  CHECK(has(testing::error_of([&] { server.set_mask_set({3, 7}, 64); }), "fewer than the threshold"));
  CHECK(has(testing::error_of([&] { server.set_mask_set({3, 8, 7}, 64); }), "not sorted"));
  CHECK(has(testing::error_of([&] { server.set_mask_set({3, 7, 9}, 64); }), "device 9, which is not in the roster"));
  server.set_mask_set({3, 7, 8, 20}, 64);
  CHECK(has(testing::error_of([&] { server.set_mask_set({3, 7, 8}, 64); }), "already"));

  std::map<std::uint32_t, std::vector<std::uint64_t>> masked;
  const std::vector<std::uint32_t> mask_set = ids;
  for (auto& c : p.clients) {
    masked[c.self()] = words;
    c.mask(masked[c.self()], mask_set);
  }
  CHECK(has(testing::error_of([&] { server.add_upload(4, masked[3]); }), "device 4, which is not in the mask set"));
  CHECK(has(testing::error_of([&] { server.add_upload(3, std::span(masked[3]).first(63)); }), "63 words, not 64"));
  server.add_upload(3, masked[3]);
  CHECK(has(testing::error_of([&] { server.add_upload(3, masked[3]); }), "second upload from device 3"));
  server.add_upload(7, masked[7]);
  server.add_upload(20, masked[20]);
  const auto survivors = server.survivors();
  const auto dropped = server.dropped();
  CHECK(dropped == std::vector<std::uint32_t>{8});

  const auto from_3 = p.client(3).reveal(survivors, dropped);
  const auto from_8 = p.client(8).reveal(survivors, {});
  CHECK(has(testing::error_of([&] { server.add_reveal(8, from_8); }), "device 8, which is not a survivor"));
  auto garbled = from_3;
  garbled[0].bytes.pop_back();
  CHECK(has(testing::error_of([&] { server.add_reveal(3, garbled); }), "not a share"));
  // Shares of another holder passed off as its own.
  auto borrowed = from_3;
  borrowed[0] = p.client(7).reveal(survivors, dropped)[0];
  CHECK(has(testing::error_of([&] { server.add_reveal(3, borrowed); }), "not at its own point"));
  auto unknown = from_3;
  unknown[0].id = 99;
  CHECK(has(testing::error_of([&] { server.add_reveal(3, unknown); }), "device 99, which is not in the mask set"));
  server.add_reveal(3, from_3);
  CHECK(has(testing::error_of([&] { server.add_reveal(3, from_3); }), "second reveal from device 3"));
  CHECK(has(testing::error_of([&] { server.add_upload(8, masked[8]); }), "after unmasking began"));
  server.add_reveal(7, p.client(7).reveal(survivors, dropped));
  server.add_reveal(20, p.client(20).reveal(survivors, dropped));
  REQUIRE(server.can_unmask());
  const auto sum = server.unmask();
  for (const auto w : sum) CHECK_EQ(w, std::uint64_t{15});
}

TEST_CASE("a dishonest reveal of the dropped devices' mask keys makes unmasking fail, not lie") {
  const std::vector<std::uint32_t> ids = {1, 2, 30, 31, 1000};
  const auto models = make_models(ids, 500, 17);
  const auto words = encode_all(models);
  const std::vector<std::uint32_t> mask_set = ids;

  // swap_by: the survivors that reveal dropped device 1's share as device 31's and the reverse.
  const auto attempt = [&](std::uint64_t round, const std::set<std::uint32_t>& swap_by) {
    auto p = make_party(ids, round, 3);
    secagg_server server(round, p.roster, 3);
    server.set_mask_set(mask_set, words.begin()->second.size());
    for (auto& c : p.clients) {
      auto w = words.at(c.self());
      c.mask(w, mask_set);
      if (c.self() != 1 && c.self() != 31) server.add_upload(c.self(), w);
    }
    const auto survivors = server.survivors();
    const auto dropped = server.dropped();
    REQUIRE(dropped == std::vector<std::uint32_t>{1, 31});
    for (const auto id : survivors) {
      auto shares = p.client(id).reveal(survivors, dropped);
      if (swap_by.count(id) > 0)
        for (auto& a : shares)
          if (a.id == 1 || a.id == 31) a.id = a.id == 1 ? 31 : 1;
      server.add_reveal(id, shares);
    }
    REQUIRE(server.can_unmask());
    return testing::error_of([&] { server.unmask(); });
  };
  CHECK(attempt(20, {}) == "");
  // Every revealer swaps: the shares combine, to the other device's key, which the roster catches.
  const auto all = attempt(21, {2, 30, 1000});
  CHECK(has(all, "device 1"));
  CHECK(has(all, "do not give its roster key"));
  // One revealer swaps: the shares do not combine at all.
  const auto one = attempt(22, {30});
  CHECK(has(one, "device 1"));
  CHECK(has(one, "inconsistent"));
}

TEST_CASE("masked replica words sum to each block's weighted mean over the devices that hold it") {
  // Three blocks of 2, 3 and 1 parameters and 0, 1, 0 state values.
  core::flat_layout lay{{0, 2, 5, 6}, {0, 0, 1, 1}};
  const privacy::block_ranges ranges{{0, 3}};
  CHECK(privacy::replica_words(lay, ranges) == 3 + 6 + 1);
  // Device A holds [0, 2) with 10 samples, device B holds [0, 3) with 30.
  const privacy::held_segment a{0, 2, {1, 2, 3, 4, 5}, {7}};
  const privacy::held_segment b{0, 3, {-1, -2, -3, -4, -5, 9}, {1}};
  auto wa = privacy::encode_replica(lay, ranges, std::span(&a, 1), 10);
  const auto wb = privacy::encode_replica(lay, ranges, std::span(&b, 1), 30);
  for (std::size_t i = 0; i < wa.size(); ++i) wa[i] += wb[i];
  const auto blocks = privacy::decode_sum(lay, ranges, wa);
  REQUIRE(blocks.size() == 3);
  CHECK(blocks[0].weight == 40);
  CHECK(blocks[0].params[0] == doctest::Approx((10 * 1 - 30 * 1) / 40.0));
  CHECK(blocks[1].params[2] == doctest::Approx((10 * 5 - 30 * 5) / 40.0));
  CHECK(blocks[1].buffers[0] == doctest::Approx((10 * 7 + 30 * 1) / 40.0));
  CHECK(blocks[2].weight == 30);  // only B holds block 2
  CHECK(blocks[2].params[0] == doctest::Approx(9.0));
  // Refused: words of other ranges, ranges beyond the model, a value too large to encode.
  CHECK_THROWS_AS(privacy::decode_sum(lay, {{0, 2}}, wa), core::error);
  CHECK_THROWS_AS(privacy::replica_words(lay, {{2, 4}}), core::error);
  const privacy::held_segment huge{0, 1, {1e30f, 0}, {}};
  CHECK_THROWS_WITH_AS(privacy::encode_replica(lay, {{0, 1}}, std::span(&huge, 1), 1), doctest::Contains("block 0"),
                       core::error);
}
