// libFuzzer target: inbound bytes as a peer would send them go through frame parsing, the
// FlatBuffers Verifier, the semantic checks and decoding of every message type and tensor.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cleave/transport/message.h"

using namespace cleave::transport;

namespace {

volatile std::uint64_t sink;

// Reads everything a receiver could read from a decoded message.
void consume(const message& m) {
  std::uint64_t h = describe(m).size();
  for_each_tensor(m, [&](std::string_view, const tensor_view& t) {
    h += static_cast<std::uint64_t>(t.numel()) + t.name.size();
    if (!t.data.empty()) h += static_cast<std::uint64_t>(t.data.front()) + static_cast<std::uint64_t>(t.data.back());
  });
  sink = h;
}

void decode_one(const std::byte* body, std::uint32_t len, const frame_limits& limits) {
  aligned_bytes frame = aligned_bytes::allocate(frame_header_bytes + len);
  if (frame.empty()) return;
  auto* p = reinterpret_cast<unsigned char*>(frame.data());
  p[0] = static_cast<unsigned char>(len);
  p[1] = static_cast<unsigned char>(len >> 8);
  p[2] = static_cast<unsigned char>(len >> 16);
  p[3] = static_cast<unsigned char>(len >> 24);
  if (len) std::memcpy(frame.data() + frame_header_bytes, body, len);
  auto r = decode_frame(std::move(frame), limits);
  if (r.ok()) consume(*r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  frame_limits limits;
  limits.max_frame_bytes = 1 << 20;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);

  // 1. The input as a stream of frames, exactly as the channel reads it.
  std::size_t off = 0;
  while (size - off >= frame_header_bytes) {
    const std::uint32_t len = read_frame_length(bytes + off);
    if (check_frame_length(len, limits)) break;        // the channel closes here
    if (size - off - frame_header_bytes < len) break;  // truncated
    decode_one(bytes + off + frame_header_bytes, len, limits);
    off += frame_header_bytes + len;
  }

  // 2. Everything after the first 4 bytes as one frame body with a correct length prefix, so that
  //    mutations reach the Verifier and the checks without having to keep the prefix right.
  if (size > frame_header_bytes && size - frame_header_bytes <= limits.max_frame_bytes) {
    const auto len = static_cast<std::uint32_t>(size - frame_header_bytes);
    if (!check_frame_length(len, limits)) decode_one(bytes + frame_header_bytes, len, limits);
  }
  return 0;
}
