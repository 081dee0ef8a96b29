// The seeds of a micro-batch's random streams: each stream keeps the formula its numbers have
// always come from, and streams differ by purpose, device, step and micro-batch.
#include <doctest/doctest.h>

#include <set>

#include "cleave/core/micro_batch_seed.h"

using namespace cleave;
using core::hash32;
using core::mix64;
using core::stream;

TEST_CASE("every micro-batch stream keeps the formula its numbers were drawn from") {
  const std::uint64_t base = 0x1234567890abcdefULL;
  for (const std::uint32_t device : {0u, 1u, 7u, 4000000u})
    for (const std::uint64_t step : {0ull, 1ull, 99ull, 1ull << 33})
      for (const std::uint32_t mb : {0u, 3u, 255u}) {
        CAPTURE(device);
        CAPTURE(step);
        CAPTURE(mb);
        const std::uint64_t key = mix64((std::uint64_t{device} << 40) ^ (step << 8) ^ mb);
        CHECK(core::micro_batch_seed(base, device, step, mb, stream::dropout) ==
              hash32(static_cast<std::uint32_t>(step), mb));
        CHECK(core::micro_batch_seed(base, device, step, mb, stream::codec) ==
              hash32(hash32(static_cast<std::uint32_t>(step), mb), device));
        CHECK(core::micro_batch_seed(base, device, step, mb, stream::label_groups) ==
              (mix64(0x6c6162656c73ULL ^ key) >> 32));
        CHECK(core::micro_batch_seed(base, device, step, mb, stream::label_noise) == mix64(base ^ key));
        CHECK(core::micro_batch_seed(base, device, step, mb, stream::activation_noise) ==
              mix64(base ^ 0x6163746976617465ULL ^ key));
      }
}

TEST_CASE("the 32-bit streams fit 32 bits and the noise streams differ by device, step, micro-batch and base") {
  std::set<std::uint64_t> seen;
  int n = 0;
  for (const stream s : {stream::label_noise, stream::activation_noise})
    for (const std::uint64_t base : {1ull, 2ull})
      for (std::uint32_t device = 1; device <= 3; ++device)
        for (std::uint64_t step = 0; step < 4; ++step)
          for (std::uint32_t mb = 0; mb < 4; ++mb, ++n) seen.insert(core::micro_batch_seed(base, device, step, mb, s));
  CHECK(static_cast<int>(seen.size()) == n);
  for (const stream s : {stream::dropout, stream::codec, stream::label_groups})
    CHECK(core::micro_batch_seed(~0ull, ~0u, ~0ull, ~0u, s) <= 0xffffffffULL);
  static_assert(core::micro_batch_seed(0, 1, 2, 3, stream::dropout) == hash32(2, 3));
}
