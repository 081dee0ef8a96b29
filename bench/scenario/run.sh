#!/usr/bin/env bash
# The emulated deployment of `cleave demo` (boards training at 4 GFLOP/s on Wi-Fi to
# their edge, see docs/getting-started.md), time to a target test accuracy side by side in one run:
#   (a) every block on the devices (federated averaging),
#   (b) the best fixed split among the candidate plans (each run to the target),
#   (c) adaptive, f32, one micro-batch,
#   (d) adaptive with 4 pipelined micro-batches and codecs (the demo's default).
# Each run ends at the round that reaches the target (--stop-at-accuracy).
# Usage: bench/scenario/run.sh [--model lenet5|resnet8] [--target 0.80] [--rounds 8]
#                              [--local-steps 150] [--plans 3,8:4,8:6,12:3,12] [--seed 1]
# BUILD (default build) names the build directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$root/build}
[ -x "$build/apps/cleave" ] || "$root/scripts/build.sh" >/dev/null
exec python3 "$root/bench/scenario/scenario.py" --cleave "$build/apps/cleave" "$@"
