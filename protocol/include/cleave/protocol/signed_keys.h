// Secure aggregation against a malicious server: a device's round keys travel with its
// certificate and its signature over them, and every roster is checked member by member before a
// device shares anything with it.
#pragma once

#include <cstdint>
#include <span>

#include "cleave/privacy/secagg.h"
#include "cleave/protocol/protocol.h"
#include "cleave/transport/tls_context.h"

namespace cleave::protocol {

// Device `self`'s keys for `round`, signed with its certificate's key and carrying the certificate.
privacy::roster_entry signed_keys(const transport::tls_context& tls, std::uint64_t round, std::uint32_t self,
                                  const privacy::bytes32& mask_public, const privacy::bytes32& encrypt_public);

// Throws core::error naming what fails: member e's certificate (the federation CA, valid, not
// revoked), that it is a device's bound to e.id, and its signature over e's keys for `round`.
void check_member(const transport::tls_context& tls, std::uint64_t round, const privacy::roster_entry& e);

// A keys message (up) of device `sender`: its own keys only, each passing check_member.
void check_sender_keys(const transport::tls_context& tls, const wire::SecAgg& m, std::uint32_t sender);

// What a device accepts as a roster (the server sends it, with the threshold of shares that
// recovers a seed): at least `min_roster` members, sorted by id without repeats, no public key
// twice, a threshold above half the roster and at most its size, and every other member passing
// check_member (its own entry is compared by the secure aggregation client). Throws core::error
// naming the rule broken.
void check_roster(const transport::tls_context& tls, std::uint64_t round, std::uint32_t self,
                  std::span<const privacy::roster_entry> roster, int threshold, int min_roster);

}  // namespace cleave::protocol
