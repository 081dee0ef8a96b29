// The demo's emulated edge board: how much slower than this machine a device must run to train
// the model as fast as the board would.
#pragma once

#include <string>

namespace cleave::apps {

struct board_emulation {
  double host_gflops = 0;  // this machine, training the model on the devices' backend
  double step_ms = 0;      // its median training step
  double slowdown = 1;     // host_gflops / the board's, at least 1
};

// Trains `model` on a few batches of `data` (a directory as `cleave demo` unpacks it) with
// `backend` (the devices' own: kernels and threads) and returns the slowdown that makes a step
// take as long as on a board training at `board_gflops` (a step costing three forward passes).
// Takes about half a second (at least 3 timed steps after 2 warm-up steps).
board_emulation emulate_board(const std::string& model, const std::string& data, const std::string& backend, int batch,
                              double board_gflops);

}  // namespace cleave::apps
