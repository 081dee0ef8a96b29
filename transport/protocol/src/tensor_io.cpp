// Tensors between backends and messages.
#include "cleave/transport/tensor_io.h"

namespace cleave::transport {

core::tensor to_backend(core::backend& b, const tensor_view& v) {
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

}  // namespace cleave::transport
