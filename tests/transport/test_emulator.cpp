// The network emulator's schedule in virtual time: token bucket, latency, changes on the fly.
#include <doctest/doctest.h>

#include "cleave/transport/net_emulator.h"

using namespace cleave::transport;
using namespace std::chrono_literals;
using clock_type = net_emulator::clock;

namespace {

double ms_after(clock_type::time_point t, clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(t - t0).count();
}

link_caps caps(double rate, std::size_t burst, std::chrono::microseconds latency) {
  link_caps c;
  c.bytes_per_second = rate;
  c.burst_bytes = burst;
  c.latency = latency;
  return c;
}

}  // namespace

TEST_CASE("without caps the emulator lets everything through at once") {
  net_emulator e;
  CHECK_FALSE(e.active());
  const auto t0 = clock_type::now();
  CHECK(e.schedule(1 << 20, t0) == t0);
  CHECK(e.schedule(1 << 20, t0) == t0);
}

TEST_CASE("the token bucket passes a burst, then paces at the rate") {
  net_emulator e(caps(1000, 100, 0us));
  CHECK(e.active());
  const auto t0 = clock_type::now();
  CHECK(ms_after(e.schedule(100, t0), t0) == doctest::Approx(0));
  CHECK(ms_after(e.schedule(100, t0), t0) == doctest::Approx(100));
  CHECK(ms_after(e.schedule(50, t0), t0) == doctest::Approx(150));
  // After an idle second the bucket is full again (but holds no more than the burst).
  const auto t1 = t0 + 1s;
  CHECK(ms_after(e.schedule(100, t1), t1) == doctest::Approx(0));
  CHECK(ms_after(e.schedule(10, t1), t1) == doctest::Approx(10));
}

TEST_CASE("a chunk larger than the burst waits for its whole debt") {
  net_emulator e(caps(1e6, 1000, 0us));
  const auto t0 = clock_type::now();
  CHECK(ms_after(e.schedule(101000, t0), t0) == doctest::Approx(100));
  CHECK(ms_after(e.schedule(1000, t0), t0) == doctest::Approx(101));
}

TEST_CASE("latency delays every chunk without lowering throughput") {
  net_emulator e(caps(1000, 100, 50ms));
  const auto t0 = clock_type::now();
  CHECK(ms_after(e.schedule(100, t0), t0) == doctest::Approx(50));
  CHECK(ms_after(e.schedule(100, t0), t0) == doctest::Approx(150));
  CHECK(ms_after(e.schedule(100, t0), t0) == doctest::Approx(250));
  net_emulator only_latency(caps(0, 100, 20ms));
  CHECK(ms_after(only_latency.schedule(1 << 30, t0), t0) == doctest::Approx(20));
  CHECK(ms_after(only_latency.schedule(1 << 30, t0), t0) == doctest::Approx(20));
}

TEST_CASE("changing the caps takes effect on the next chunk") {
  net_emulator e(caps(1000, 100, 0us));
  const auto t0 = clock_type::now();
  CHECK(ms_after(e.schedule(100, t0), t0) == doctest::Approx(0));
  CHECK(ms_after(e.schedule(100, t0), t0) == doctest::Approx(100));
  e.set_bandwidth(10000);
  CHECK(ms_after(e.schedule(100, t0), t0) == doctest::Approx(110));
  e.set_latency(5ms);
  CHECK(ms_after(e.schedule(100, t0), t0) == doctest::Approx(125));
  e.set_bandwidth(0);
  e.set_latency(0ms);
  CHECK_FALSE(e.active());
  CHECK(ms_after(e.schedule(100, t0 + 1s), t0) == doctest::Approx(1000));
}
