// Signed round keys and the roster checks a device makes before it shares its seeds.
#include "cleave/protocol/signed_keys.h"

#include <algorithm>
#include <set>
#include <string>

#include "cleave/core/error.h"

namespace cleave::protocol {

privacy::roster_entry signed_keys(const transport::tls_context& tls, std::uint64_t round, std::uint32_t self,
                                  const privacy::bytes32& mask_public, const privacy::bytes32& encrypt_public) {
  privacy::roster_entry e{self, mask_public, encrypt_public};
  e.certificate = tls.certificate_der();
  e.signature = tls.sign(privacy::keys_statement(round, e));
  return e;
}

void check_member(const transport::tls_context& tls, std::uint64_t round, const privacy::roster_entry& e) {
  const std::string who = "roster member " + std::to_string(e.id);
  if (e.certificate.empty() || e.signature.empty())
    throw core::error(who + ": keys without a certificate or signature");
  transport::tls_context::vouched v;
  try {
    v = tls.verify_signed(e.certificate, privacy::keys_statement(round, e), e.signature);
  } catch (const core::error& err) {
    throw core::error(who + ": " + err.what());
  }
  if (v.role != core::tier::device)
    throw core::error(who + ": certificate '" + v.identity + "' is not a device's (" +
                      (v.role ? std::string(core::tier_name(*v.role)) : std::string("no role")) + ")");
  if (v.node_id != e.id)
    throw core::error(who + ": certificate '" + v.identity + "' is bound to " +
                      (v.node_id ? "device " + std::to_string(*v.node_id) : std::string("no device id")));
}

void check_sender_keys(const transport::tls_context& tls, const wire::SecAgg& m, std::uint32_t sender) {
  for (const auto& k : keys_of(m)) {
    if (k.id != sender)
      throw core::error("keys of device " + std::to_string(k.id) + " sent by device " + std::to_string(sender));
    check_member(tls, m.round(), k);
  }
}

void check_roster(const transport::tls_context& tls, std::uint64_t round, std::uint32_t self,
                  std::span<const privacy::roster_entry> roster, int threshold, int min_roster) {
  const int n = static_cast<int>(roster.size());
  if (n < min_roster)
    throw core::error("a roster of " + std::to_string(n) + " devices, below this device's --secagg-min-roster " +
                      std::to_string(min_roster));
  if (2 * threshold <= n || threshold > n)
    throw core::error("threshold " + std::to_string(threshold) + " for a roster of " + std::to_string(n) +
                      " (it must be above half the roster: fewer colluding devices could then unmask one)");
  std::set<privacy::bytes32> keys;
  for (int i = 0; i < n; ++i) {
    const auto& e = roster[static_cast<std::size_t>(i)];
    if (i > 0 && e.id <= roster[static_cast<std::size_t>(i - 1)].id)
      throw core::error("roster ids are not sorted without repeats (device " + std::to_string(e.id) + ")");
    if (!keys.insert(e.mask_public).second || !keys.insert(e.encrypt_public).second)
      throw core::error("roster member " + std::to_string(e.id) + " carries a public key another member carries");
    if (e.id != self) check_member(tls, round, e);
  }
  if (std::none_of(roster.begin(), roster.end(), [self](const auto& e) { return e.id == self; }))
    throw core::error("a roster without this device");
}

}  // namespace cleave::protocol
