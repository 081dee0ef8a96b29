// The demo's emulated edge board (demo_board.h).
#include "demo_board.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <vector>

#include "cleave/backend/registry.h"
#include "cleave/core/error.h"
#include "cleave/core/trainer.h"

namespace cleave::apps {

board_emulation emulate_board(const std::string& model, const std::string& data, const std::string& backend, int batch,
                              double board_gflops, double at_most) {
  if (!(board_gflops > 0)) throw core::error("--board-gflops must be above 0");
  if (!(at_most >= 0)) throw core::error("a board's share of this machine must be at least 0");
  core::load_options lo;
  lo.test = false;
  const std::int64_t kept = 8LL * batch;
  lo.pick_train = [kept](const std::vector<std::int32_t>& labels, int) {
    std::vector<std::int64_t> idx(static_cast<std::size_t>(std::min<std::int64_t>(kept, labels.size())));
    std::iota(idx.begin(), idx.end(), 0);
    return idx;
  };
  const auto d = core::load_dataset(data, lo);
  if (d.train.size() < batch) throw core::error("data set '" + data + "': fewer samples than one batch");
  const auto m = core::resolve_model(model, d.train.item, d.train.n_classes);
  auto b = backend::make_backend(backend);
  core::train_config c;
  c.batch = batch;
  core::trainer t(*b, m, c);
  std::vector<float> x(static_cast<std::size_t>(batch * d.train.item.numel()));
  std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
  std::vector<std::int64_t> idx(static_cast<std::size_t>(batch));
  const std::int64_t n_batches = d.train.size() / batch;
  auto step = [&](int s) {  // the kept samples are the first ones: batch s % n_batches of them
    std::iota(idx.begin(), idx.end(), (s % n_batches) * batch);
    d.train.gather(idx.data(), batch, x.data(), y.data());
    float loss = 0;
    b->download(t.step(x.data(), y.data(), batch), &loss);  // waits for the step
  };
  using clock = std::chrono::steady_clock;
  for (int s = 0; s < 2; ++s) step(s);
  std::vector<double> secs;
  const auto began = clock::now();
  while (secs.size() < 3 || (clock::now() - began < std::chrono::milliseconds(500) && secs.size() < 200)) {
    const auto t0 = clock::now();
    step(static_cast<int>(secs.size()) + 2);
    secs.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  // The fastest step, as the planner's block profiles take the fastest repetition: on a busy
  // machine the median is the other work's as much as this one's, and a slowdown set from it
  // would make the boards faster than asked against the profiles the planner sees.
  const double fastest = *std::min_element(secs.begin(), secs.end());
  double flops = 0;
  for (const auto& blk : m.blocks) flops += blk.flops;
  const double step_flops = 3.0 * flops * batch;  // forward, backward data, backward weights
  board_emulation e;
  e.step_ms = fastest * 1e3;
  e.host_gflops = step_flops / fastest / 1e9;
  e.board_gflops = at_most > 0 ? std::min(board_gflops, at_most * e.host_gflops) : board_gflops;
  e.slowdown = std::max(1.0, e.host_gflops / e.board_gflops);
  return e;
}

}  // namespace cleave::apps
