// What the privacy benches share: a federation of devices on threads of this process whose
// first device's outgoing frames are kept, decoding of those frames, and the order in which a
// device drew its training samples.
#pragma once

#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "cleave/core/dataset.h"
#include "cleave/federation/local_federation.h"
#include "cleave/transport/message.h"

namespace cleave::bench {

// Every frame device 1 sends, in order.
struct frame_capture {
  std::mutex mu;
  std::vector<std::vector<std::byte>> frames;
};

// A federation of n devices straight to the server (no edge), fixed plans, LeNet-style
// settings the benches share; each device takes the whole training split ("all") in its own
// order. `customise` adjusts each device; the caller adjusts c.server further.
inline federation::local_config capturing_federation(const std::filesystem::path& work, const std::string& model,
                                                     const std::string& data, const std::string& backend,
                                                     std::uint32_t n, int rounds, int steps, frame_capture& cap,
                                                     const std::function<void(device::agent_config&)>& customise) {
  federation::local_config c;
  c.certs = work / "certs";
  federation::provision_local(c.certs, static_cast<int>(n), 0);
  c.use_edge = false;
  auto& s = c.server;
  s.model = model;
  s.data = data;
  s.backend = backend;
  s.rounds = rounds;
  s.local_steps = steps;
  s.min_devices = static_cast<int>(n);
  s.adaptive = false;
  s.opt.lr = 0.05f;
  for (std::uint32_t id = 1; id <= n; ++id) {
    device::agent_config a;
    a.id = id;
    a.data = data;
    a.backend = backend;
    a.partition = cleave::core::parse_partition("all");
    if (customise) customise(a);
    if (id == 1)
      a.on_send = [&cap](std::span<const std::byte> f) {
        std::lock_guard lock(cap.mu);
        cap.frames.emplace_back(f.begin(), f.end());
      };
    c.devices.push_back(a);
  }
  return c;
}

// A captured frame decoded as its receiver would.
inline transport::result<transport::message> decode_captured(const std::vector<std::byte>& f) {
  auto buf = transport::aligned_bytes::allocate(f.size());
  std::memcpy(buf.data(), f.data(), f.size());
  return transport::decode_frame(std::move(buf), transport::frame_limits{});
}

// The training sample a device with partition "all" drew at position pos of its stream (its
// own epoch orders one after the other).
class sample_stream {
 public:
  sample_stream(std::int64_t n, std::uint64_t order_seed) : n_(n), seed_(order_seed) {}
  std::int64_t index_at(std::int64_t pos) {
    if (pos / n_ != epoch_) order_ = core::epoch_order(n_, seed_, epoch_ = pos / n_);
    return order_[static_cast<std::size_t>(pos % n_)];
  }

 private:
  std::int64_t n_;
  std::uint64_t seed_;
  std::int64_t epoch_ = -1;
  std::vector<std::int64_t> order_;
};

}  // namespace cleave::bench
