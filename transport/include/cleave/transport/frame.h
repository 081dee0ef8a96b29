// Frames on the wire: a 4-byte little-endian length, then a FlatBuffers buffer with the file
// identifier "CLV1". Limits that bound what a peer can make us allocate or walk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace cleave::transport {

// Frame layout (byte offsets):
//   [0, 4)        body length n, uint32 little-endian (a FlatBuffers size prefix)
//   [4, 4 + n)    FlatBuffers buffer: root offset, file identifier "CLV1", tables
// A whole frame is a size-prefixed FlatBuffer; its tensor data is 32-byte aligned relative to
// the start of the frame, so frames are received into 32-byte aligned memory.
inline constexpr std::size_t frame_header_bytes = 4;
inline constexpr std::size_t frame_alignment = 32;
// Root offset + identifier + the smallest table.
inline constexpr std::uint32_t min_frame_body_bytes = 12;
// FlatBuffers' own bound (2 GiB - 1 with the prefix).
inline constexpr std::uint32_t max_frame_body_bytes_hard = 0x7fffffffu - 8;

// What an inbound frame may contain. Every bound applies before memory is allocated or
// anything is walked.
struct frame_limits {
  std::uint32_t max_frame_bytes = 256u << 20;  // body bytes of one frame
  std::uint32_t max_depth = 16;                // nesting of tables and vectors
  std::uint32_t max_tables = 1u << 16;         // tables in one frame
  std::uint32_t max_tensors = 4096;            // tensors in one message
  std::uint32_t max_list = 1u << 16;           // entries of any other list
  std::uint32_t max_string_bytes = 4096;       // any string but the model spec
  std::uint32_t max_model_bytes = 1u << 20;    // the model spec in a Plan
  std::uint32_t max_blocks = 1u << 16;         // block indices lie in [0, max_blocks]
  std::uint32_t max_micro_batches = 1u << 16;  // micro-batch ids lie in [0, max_micro_batches)
  std::uint32_t max_node_id = 1u << 24;        // node ids lie in [0, max_node_id)
};

// Reads the body length of a frame header.
inline std::uint32_t read_frame_length(const std::byte* header) {
  const auto* p = reinterpret_cast<const unsigned char*>(header);
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

// Checks a frame's announced body length; returns why it is refused, or nothing.
std::optional<std::string> check_frame_length(std::uint32_t body_bytes, const frame_limits& limits);

// Owned memory, 32-byte aligned; holds a received frame. Large blocks are recycled through a
// process-wide pool.
class aligned_bytes {
 public:
  aligned_bytes() = default;
  // Returns an empty object (data() == nullptr) when the allocation fails.
  static aligned_bytes allocate(std::size_t n);

  std::byte* data() { return p_.get(); }
  const std::byte* data() const { return p_.get(); }
  std::size_t size() const { return n_; }
  bool empty() const { return p_ == nullptr; }

 private:
  struct releaser {
    std::size_t capacity;
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte[], releaser> p_;
  std::size_t n_ = 0;
};

}  // namespace cleave::transport
