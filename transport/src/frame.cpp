// Frame length checks and the aligned memory frames are received into.
#include "cleave/transport/frame.h"

#include <string>

#include "buffer_pool.h"
#include "cleave/transport/result.h"

namespace cleave::transport {

std::optional<std::string> check_frame_length(std::uint32_t body_bytes, const frame_limits& limits) {
  const std::uint32_t max =
      limits.max_frame_bytes < max_frame_body_bytes_hard ? limits.max_frame_bytes : max_frame_body_bytes_hard;
  if (body_bytes > max)
    return "frame of " + std::to_string(body_bytes) + " bytes exceeds the limit of " + std::to_string(max) + " bytes";
  if (body_bytes < min_frame_body_bytes)
    return "frame of " + std::to_string(body_bytes) + " bytes is shorter than the smallest message (" +
           std::to_string(min_frame_body_bytes) + " bytes)";
  return std::nullopt;
}

aligned_bytes aligned_bytes::allocate(std::size_t n) {
  aligned_bytes b;
  std::size_t capacity = 0;
  void* p = detail::pool_take(n, capacity);
  if (!p) return b;
  b.p_ = std::unique_ptr<std::byte[], releaser>(static_cast<std::byte*>(p), releaser{capacity});
  b.n_ = n;
  return b;
}

void aligned_bytes::releaser::operator()(std::byte* p) const {
  detail::pool_give(p, capacity);
}

std::string_view errc_name(errc e) {
  switch (e) {
    case errc::closed:
      return "closed";
    case errc::connection:
      return "connection";
    case errc::refused:
      return "refused";
    case errc::bad_frame:
      return "bad frame";
    case errc::timeout:
      return "timeout";
    case errc::too_large:
      return "too large";
    case errc::out_of_memory:
      return "out of memory";
  }
  return "?";
}

}  // namespace cleave::transport
