// The demo's emulated edge board: how much slower than this machine a device must run to train
// the model as fast as the board would.
#pragma once

#include <string>

namespace cleave::apps {

struct board_emulation {
  double host_gflops = 0;  // this machine, training the model on the devices' backend
  double step_ms = 0;      // its fastest training step
  double board_gflops = 0; // the boards' speed emulated
  double slowdown = 1;     // host_gflops / board_gflops, at least 1
};

// Trains `model` on a few batches of `data` (a directory as `cleave demo` unpacks it) with
// `backend` (the devices' own: kernels and threads) and returns the slowdown that makes a step
// take as long as on a board training at `board_gflops` (a step costing three forward passes),
// or at `at_most` times this machine's speed where that is slower (0: no such bound). Takes about
// half a second (at least 3 timed steps after 2 warm-up steps).
board_emulation emulate_board(const std::string& model, const std::string& data, const std::string& backend, int batch,
                              double board_gflops, double at_most = 0);

}  // namespace cleave::apps
