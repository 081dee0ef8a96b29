// libFuzzer target: inbound bytes as a peer would send them go through frame parsing, the
// FlatBuffers Verifier, the semantic checks, decoding of every message type and tensor, and the
// model spec parser (the spec a Plan carries, and the whole input read as a spec text).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "cleave/core/error.h"
#include "cleave/core/model.h"
#include "cleave/transport/message.h"

using namespace cleave::transport;
namespace core = cleave::core;

namespace {

volatile std::uint64_t sink;

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "fuzz: property violated: %s\n", what);
  std::abort();
}

// Parses a spec as a receiver of a Plan does and builds its blocks. core::error is the expected
// outcome of a bad spec; any other exception escapes and is a finding.
void parse_spec(std::string_view text) {
  core::model_spec m;
  try {
    m = core::parse_model_spec(text, "fuzz");
  } catch (const core::error&) {
    return;
  }
  // An accepted spec is one other nodes accept the same way: its compact JSON parses to itself.
  core::model_spec again;
  try {
    again = core::parse_model_spec(m.json, "fuzz");
  } catch (const core::error&) {
    violated("the compact JSON of an accepted spec is refused");
  }
  if (again.json != m.json || again.n_blocks() != m.n_blocks() || again.n_params() != m.n_params() ||
      !(again.input == m.input) || again.n_classes != m.n_classes)
    violated("the compact JSON of an accepted spec parses to another spec");

  const core::flat_layout lay = core::layout_of(m);
  if (lay.param_offset.back() != m.n_params() || lay.param_offset.back() > core::spec_limits::max_params)
    violated("parameter layout disagrees with the spec");
  // Every block builds with the shapes the spec reported (what a stage does with its range).
  const auto blocks = core::build_blocks(m, 0, m.n_blocks());
  std::uint64_t h = m.name.size();
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const core::block_info& b = m.blocks[i];
    if (blocks[i]->kind() != b.kind || !(blocks[i]->input_shape() == b.in) || !(blocks[i]->output_shape() == b.out))
      violated("a built block differs from the spec's block");
    h += static_cast<std::uint64_t>(b.flops);
  }
  sink = h;
}

// Reads everything a receiver could read from a decoded message.
void consume(const message& m) {
  std::uint64_t h = describe(m).size();
  for_each_tensor(m, [&](std::string_view, const tensor_view& t) {
    h += static_cast<std::uint64_t>(t.numel()) + t.name.size();
    if (!t.data.empty()) h += static_cast<std::uint64_t>(t.data.front()) + static_cast<std::uint64_t>(t.data.back());
  });
  // An accepted step tensor decodes whatever its codec (its scales and positions were checked).
  const cleave::wire::Tensor* step = nullptr;
  if (const auto* a = m.as<cleave::wire::Activations>()) step = a->activation();
  if (const auto* g = m.as<cleave::wire::Gradients>()) step = g->gradient();
  if (step && step->dtype() != cleave::wire::DType::i32) {
    const tensor_view v = view_of(*step);
    if (v.codec != core::codec::f32 || v.dtype == core::dtype::f32) {
      std::vector<float> y(static_cast<std::size_t>(v.numel()));
      v.decode(y.data());
      if (!y.empty()) h += static_cast<std::uint64_t>(y.front() != 0) + static_cast<std::uint64_t>(y.back() != 0);
    }
  }
  sink = h;
  if (const auto* p = m.as<cleave::wire::Plan>(); p && p->model()) parse_spec(p->model()->string_view());
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

  // 3. The whole input as a model spec text (a local file, or a Plan's spec field as is). A frame
  //    fails here at its first byte, and a spec fails the frame paths at once, so both run always.
  parse_spec(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
