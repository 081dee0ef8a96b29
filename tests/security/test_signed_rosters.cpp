// Secure aggregation against a malicious server: the rosters a device refuses before it shares
// anything (a member the server made up, keys swapped, a certificate of another role, bound to
// another id, revoked or from another CA, too few members, a threshold of half or less, repeats).
#include <doctest/doctest.h>

#include "../runtime/federation.h"
#include "../support/error_of.h"
#include "cleave/protocol/signed_keys.h"
#include "cleave/transport/certs.h"

using namespace cleave;
using namespace cleave::testing;

namespace {

// Node `name` of the workspace: its TLS state, as its process loads it.
transport::tls_context tls(const workspace& w, const std::string& name) {
  return transport::tls_context(transport::tls_files_in(w.certs, name));
}

// Round keys of device `id` for round 7, signed by `signer` (fresh X25519 keys).
privacy::roster_entry keys(const transport::tls_context& signer, std::uint32_t id) {
  const auto m = privacy::x25519_keypair(), e = privacy::x25519_keypair();
  return protocol::signed_keys(signer, 7, id, m.public_key, e.public_key);
}

}  // namespace

TEST_CASE("a device takes a roster of signed devices and refuses every one a malicious server could craft") {
  workspace w("sec-roster", 4, 64, 32);
  const auto me = tls(w, "device-1"), d2 = tls(w, "device-2"), d3 = tls(w, "device-3"), d4 = tls(w, "device-4");
  const std::vector<privacy::roster_entry> honest = {keys(me, 1), keys(d2, 2), keys(d3, 3)};
  const auto refusal = [&](const std::vector<privacy::roster_entry>& r, int threshold, int min_roster = 3) {
    return error_of([&] { protocol::check_roster(me, 7, 1, r, threshold, min_roster); });
  };
  CHECK(refusal(honest, 2) == "");
  CHECK(refusal({honest[0], honest[1], honest[2], keys(d4, 4)}, 3) == "");

  SUBCASE("the victim and one member of the server's: too few, whatever they sign") {
    CHECK(refusal({honest[0], honest[1]}, 2) == "a roster of 2 devices, below this device's --secagg-min-roster 3");
  }
  SUBCASE("a threshold of half the roster or less, or above it") {
    CHECK(refusal(honest, 1).find("threshold 1 for a roster of 3") == 0);
    CHECK(refusal({honest[0], honest[1], honest[2], keys(d4, 4)}, 2).find("threshold 2 for a roster of 4") == 0);
    CHECK(refusal(honest, 4).find("threshold 4") == 0);
  }
  SUBCASE("members the server made up: its own certificate, or none") {
    const auto server = tls(w, "server");
    auto fake = honest;
    fake[2] = keys(server, 3);
    CHECK(refusal(fake, 2) == "roster member 3: certificate 'server' is not a device's (server)");
    fake[2].certificate.clear();
    CHECK(refusal(fake, 2) == "roster member 3: keys without a certificate or signature");
  }
  SUBCASE("a device's certificate and signature with keys the server swapped in") {
    auto swapped = honest;
    swapped[2].mask_public = privacy::x25519_keypair().public_key;
    CHECK(refusal(swapped, 2) ==
          "roster member 3: the signature does not verify under the key of certificate 'device-3'");
    // Its keys of another round, replayed.
    auto replayed = honest;
    const auto m = privacy::x25519_keypair(), e = privacy::x25519_keypair();
    replayed[2] = protocol::signed_keys(d3, 6, 3, m.public_key, e.public_key);
    CHECK(refusal(replayed, 2).find("the signature does not verify") != std::string::npos);
  }
  SUBCASE("one colluding device standing in for another id") {
    auto stand_in = honest;
    stand_in[2] = keys(d4, 3);  // device-4 signs keys claimed for device 3
    CHECK(refusal(stand_in, 2) == "roster member 3: certificate 'device-4' is bound to device 4");
  }
  SUBCASE("ids or keys twice") {
    auto twice = honest;
    twice[2] = honest[1];
    CHECK(refusal(twice, 2).find("not sorted without repeats") != std::string::npos);
    auto same_keys = honest;
    same_keys[2].mask_public = honest[1].mask_public;
    CHECK(refusal(same_keys, 2) == "roster member 3 carries a public key another member carries");
  }
  SUBCASE("a revoked device, and one of another federation's CA") {
    transport::revoke_certificate(w.certs, w.certs / "device-3.crt");
    const auto me_now = tls(w, "device-1");  // as after a reload: the list in force
    CHECK(error_of([&] { protocol::check_roster(me_now, 7, 1, honest, 2, 3); })
              .find("roster member 3: certificate "
                    "'device-3': ") == 0);
    CHECK(error_of([&] { protocol::check_roster(me_now, 7, 1, honest, 2, 3); }).find("revoked") != std::string::npos);
    workspace other("sec-roster-other", 3, 64, 32);
    auto foreign = honest;
    foreign[1] = keys(tls(other, "device-2"), 2);
    CHECK(refusal(foreign, 2).find("roster member 2: certificate 'device-2': ") == 0);
  }
  SUBCASE("a roster without this device") {
    CHECK(refusal({honest[1], honest[2], keys(d4, 4)}, 2) == "a roster without this device");
  }
}
