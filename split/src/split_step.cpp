// The split step as one loop: forward up the route, the loss at its end, backward down, the
// optimizer steps inside the segment hosts.
#include "cleave/split/split_step.h"

#include <algorithm>
#include <vector>

#include "cleave/core/error.h"
#include "cleave/core/micro_batch_seed.h"

namespace cleave::split {

core::tensor cross_hop(core::backend& from, core::backend& to, const core::tensor& t) {
  std::vector<std::uint8_t> bytes(t.bytes());
  from.download(t, bytes.data());
  core::tensor out = to.empty(t.shape(), t.dtype());
  to.upload(out, bytes.data());
  return out;
}

split_step_result split_step(const tier_hosts& hosts, std::uint32_t device, const route& r, std::uint64_t step,
                             const core::tensor& x, const core::tensor& y, std::uint32_t n_micro_batches) {
  // x (B, in...), y (B) on the device's backend; each micro-batch (b, in...), b = B / n_micro_batches
  const std::int64_t batch = x.shape()[0];
  CLEAVE_ASSERT(n_micro_batches > 0 && batch % n_micro_batches == 0);
  const std::int64_t b = batch / n_micro_batches;
  const float share = static_cast<float>(b) / static_cast<float>(batch);  // of the step's mean loss
  auto host_on = [&](int seg) -> segment_host& { return *hosts.at(r.path[static_cast<std::size_t>(seg)]); };
  core::backend& dev = host_on(0).device_backend();
  split_step_result res;
  for (std::uint32_t mb = 0; mb < n_micro_batches; ++mb) {
    const micro_batch_id id{step, mb};
    const core::tensor xs = x.slice_batch(mb * b, b), ys = y.slice_batch(mb * b, b);
    const auto dropout_seed =
        static_cast<std::uint32_t>(core::micro_batch_seed(0, device, step, mb, core::stream::dropout));
    // forward: segment by segment up the route until one computes the loss (labels go with it)
    core::backend* at = &dev;
    core::tensor v = xs;
    int seg = 0;
    segment_output out;
    for (;; ++seg) {
      segment_host& h = host_on(seg);
      const core::tensor in = cross_hop(*at, h.device_backend(), v);
      const core::tensor labels = seg == r.loss_segment() ? cross_hop(dev, h.device_backend(), ys) : core::tensor{};
      out = h.forward(device, seg, id, in, labels, share, n_micro_batches, dropout_seed);
      at = &h.device_backend();
      v = out.value;
      if (out.dir != segment_output::direction::up) break;
    }
    res.loss += static_cast<double>(out.loss) * share;
    res.n_correct += out.n_correct;
    // backward: the loss's gradient down the route to the device's bottom
    while (out.dir == segment_output::direction::down) {
      --seg;
      segment_host& h = host_on(seg);
      out = h.backward(device, seg, id, cross_hop(*at, h.device_backend(), v));
      at = &h.device_backend();
      v = out.value;
    }
    res.end_segment = std::max(res.end_segment, seg);
  }
  return res;
}

}  // namespace cleave::split
