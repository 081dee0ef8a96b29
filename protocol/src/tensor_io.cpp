// Tensors between backends and messages. The cut codecs run where the tensor lives: f16 / bf16
// as the backend's cast, int8 as its channel_absmax, quantize_int8 and dequantize_int8, so that a
// GPU's tensor crosses the bus already encoded (2 or 1 bytes a value instead of 4). On a backend
// whose buffers are host memory the host loops read and write the tensor in place. topk
// (gradients only) is selected on the host.
#include "cleave/protocol/tensor_io.h"

#include <cstring>
#include <vector>

namespace cleave::protocol {

using transport::message_builder;
using transport::tensor_view;

namespace {

// An int8 tensor t (f32) encoded on b straight into the message.
flatbuffers::Offset<wire::Tensor> add_int8(message_builder& m, core::backend& b, const core::tensor& t,
                                           std::string_view name, const core::codec_spec& spec) {
  const auto l = core::channel_layout_of(t.shape());
  const auto nc = static_cast<std::size_t>(l.channels);
  std::vector<float> amax(nc), scales(nc), inv(nc);
  core::tensor amax_t = b.empty({l.channels});
  b.channel_absmax(t, amax_t);
  if (nc) b.download(amax_t, amax.data());
  core::int8_scales(amax.data(), l.channels, scales.data(), inv.data());
  core::tensor inv_t = b.empty({l.channels}), q = b.empty(t.shape(), core::dtype::i8);
  if (nc) b.upload(inv_t, inv.data());
  b.quantize_int8(t, inv_t, q, spec.stochastic, spec.seed);
  return m.add_coded_tensor(
      core::codec::int8, t.shape(), name,
      [&](std::span<std::byte> dst) {
        if (!dst.empty()) b.download(q, dst.data());
      },
      scales);
}

}  // namespace

core::tensor to_backend(core::backend& b, const tensor_view& v) {
  if (v.codec == core::codec::f32) {
    core::tensor t = b.empty(v.shape, v.dtype);
    if (t.bytes()) b.upload(t, v.data.data());
    return t;
  }
  core::tensor t = b.empty(v.shape, core::dtype::f32);
  if (b.host_memory()) {  // decoded in place
    if (t.numel()) v.decode(t.host<float>());
    return t;
  }
  switch (v.codec) {
    case core::codec::f16:
    case core::codec::bf16: {
      core::tensor coded = b.empty(v.shape, v.dtype);
      if (coded.bytes()) b.upload(coded, v.data.data());
      b.cast(coded, t);
      return t;
    }
    case core::codec::int8: {
      core::tensor q = b.empty(v.shape, core::dtype::i8), s = b.empty({static_cast<std::int64_t>(v.scales.size())});
      if (q.bytes()) b.upload(q, v.data.data());
      if (s.bytes()) b.upload(s, v.scales.data());
      b.dequantize_int8(q, s, t);
      return t;
    }
    default: {  // topk: scattered on the host
      std::vector<float> host(static_cast<std::size_t>(v.numel()));
      v.decode(host.data());
      if (t.bytes()) b.upload(t, host.data());
      return t;
    }
  }
}

flatbuffers::Offset<wire::Tensor> add_tensor(message_builder& m, core::backend& b, const core::tensor& t,
                                             std::string_view name) {
  return m.add_tensor(t.dtype(), t.shape(), name, [&](std::span<std::byte> dst) {
    if (!dst.empty()) b.download(t, dst.data());
  });
}

flatbuffers::Offset<wire::Tensor> add_tensor(message_builder& m, core::backend& b, const core::tensor& t,
                                             std::string_view name, const core::codec_spec& spec,
                                             std::vector<float>* residual) {
  if (spec.id == core::codec::f32 || t.dtype() != core::dtype::f32) return add_tensor(m, b, t, name);
  if (b.host_memory() && spec.id != core::codec::topk) {
    b.synchronize();  // the work that produces t
    b.make_row_major(t);
    return m.add_encoded_tensor(spec, t.shape(), name, t.numel() ? t.host<float>() : nullptr, nullptr);
  }
  switch (spec.id) {
    case core::codec::f16:
    case core::codec::bf16: {
      core::tensor coded = b.empty(t.shape(), spec.id == core::codec::f16 ? core::dtype::f16 : core::dtype::bf16);
      b.cast(t, coded);
      return m.add_coded_tensor(spec.id, t.shape(), name, [&](std::span<std::byte> dst) {
        if (!dst.empty()) b.download(coded, dst.data());
      });
    }
    case core::codec::int8:
      return add_int8(m, b, t, name, spec);
    default:
      break;
  }
  std::vector<float> host(static_cast<std::size_t>(t.numel()));
  if (!host.empty()) b.download(t, host.data());
  float* r = nullptr;
  if (residual) {
    if (residual->size() != host.size()) residual->assign(host.size(), 0.0f);  // a new shape starts afresh
    r = residual->data();
  }
  return m.add_encoded_tensor(spec, t.shape(), name, host.data(), r);
}

}  // namespace cleave::protocol
