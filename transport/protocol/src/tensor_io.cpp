// Tensors between backends and messages.
#include "cleave/transport/tensor_io.h"

#include <vector>

namespace cleave::transport {

core::tensor to_backend(core::backend& b, const tensor_view& v) {
  if (v.codec != core::codec::f32) {
    std::vector<float> host(static_cast<std::size_t>(v.numel()));
    v.decode(host.data());
    core::tensor t = b.empty(v.shape, core::dtype::f32);
    if (t.bytes()) b.upload(t, host.data());
    return t;
  }
  core::tensor t = b.empty(v.shape, v.dtype);
  if (t.bytes()) b.upload(t, v.data.data());
  return t;
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
  std::vector<float> host(static_cast<std::size_t>(t.numel()));
  if (!host.empty()) b.download(t, host.data());
  float* r = nullptr;
  if (residual && spec.id == core::codec::topk) {
    if (residual->size() != host.size()) residual->assign(host.size(), 0.0f);  // a new shape starts afresh
    r = residual->data();
  }
  return m.add_encoded_tensor(spec, t.shape(), name, host.data(), r);
}

}  // namespace cleave::transport
