// Replica checks: a device uploads exactly its own segments once per round, with finite values
// and no more samples than its steps; an edge's pre-average stays within its devices' blocks.
#include "cleave/split/replica_checks.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "../support/error_of.h"

using namespace cleave;
using cleave::testing::error_of;

namespace {

// 8 blocks: device [0,3), edge [3,5), server [5,8).
split::route three_tier() {
  return split::make_route(false, true, {3, 5}, 8);
}

}  // namespace

TEST_CASE("a device's own segment passes once but another range, a second upload or too many samples do not") {
  const std::vector<float> p(4, 0.5f), b;
  const std::uint32_t dev = 7;
  const auto rights = split::device_rights(three_tier(), 640);
  split::replica_ledger ledger;
  ledger.check({&dev, 1}, rights, {0, 3, 640, p, b});
  CHECK(error_of([&] {
          ledger.check({&dev, 1}, rights, {0, 3, 640, p, b});
        }).find("uploaded before") != std::string::npos);
  ledger.clear();
  CHECK(error_of([&] {
          ledger.check({&dev, 1}, rights, {0, 2, 640, p, b});
        }).find("not one of its segments") != std::string::npos);
  CHECK(error_of([&] {
          ledger.check({&dev, 1}, rights, {3, 5, 640, p, b});
        }).find("not one of its segments") != std::string::npos);
  CHECK(error_of([&] { ledger.check({&dev, 1}, rights, {0, 3, 641, p, b}); }).find("allow 640") != std::string::npos);
  CHECK(error_of([&] { ledger.check({&dev, 1}, rights, {0, 3, 0, p, b}); }).find("0 samples") != std::string::npos);
  // A device that joined again starts afresh.
  ledger.check({&dev, 1}, rights, {0, 3, 64, p, b});
  ledger.forget(dev);
  ledger.check({&dev, 1}, rights, {0, 3, 64, p, b});
}

TEST_CASE("a non-finite parameter or state value is refused, naming its index") {
  std::vector<float> p(5, 1.0f), b(3, 0.0f);
  p[2] = std::numeric_limits<float>::quiet_NaN();
  const std::uint32_t dev = 1;
  const auto rights = split::device_rights(three_tier(), 64);
  split::replica_ledger ledger;
  CHECK(error_of([&] { ledger.check({&dev, 1}, rights, {0, 3, 64, p, b}); }).find("parameter 2") != std::string::npos);
  p[2] = 1.0f;
  b[1] = std::numeric_limits<float>::infinity();
  CHECK(error_of([&] {
          ledger.check({&dev, 1}, rights, {0, 3, 64, p, b});
        }).find("state value 1") != std::string::npos);
  CHECK(split::first_non_finite(p, "parameter").empty());
}

TEST_CASE("an edge's part may merge its devices' device and edge blocks, never reach the server's") {
  const std::vector<float> p(4, 0.5f), b;
  const std::vector<std::uint32_t> devs{1, 2};
  split::replica_rights rights;
  for (std::size_t i = 0; i < devs.size(); ++i) split::add_relayed(rights, three_tier(), 640);
  split::replica_ledger ledger;
  ledger.check(devs, rights, {0, 5, 1280, p, b});  // a pre-average of both devices' [0,3) and [3,5)
  CHECK(error_of([&] { ledger.check(devs, rights, {3, 4, 64, p, b}); }).find("uploaded before") != std::string::npos);
  ledger.clear();
  CHECK(error_of([&] { ledger.check(devs, rights, {4, 6, 64, p, b}); }).find("reach block 5") != std::string::npos);
  CHECK(error_of([&] { ledger.check(devs, rights, {0, 3, 1281, p, b}); }).find("allow 1280") != std::string::npos);
  // The statistics-only final part (no blocks) passes whatever it claims.
  ledger.check(devs, rights, {0, 0, 0, {}, {}});
}
