#!/usr/bin/env bash
# Final test accuracy of each cut codec against f32: `cleave demo` (4 devices behind one edge,
# Dirichlet 0.5, a fixed split so that every step crosses both cuts) once per codec and seed,
# all in one run; prints per model and codec the mean accuracy, its difference from f32, the
# bytes moved and the target. Usage: bench/codecs/run.sh [--models lenet5,resnet8]
# [--seeds 1,2,3] [--codecs f32,f16,bf16,int8,topk:0.1] [--rounds N] [--local-steps N]
# BUILD (default build) names the build directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$root/build}
[ -x "$build/apps/cleave" ] || "$root/scripts/build.sh" >/dev/null
exec python3 "$root/bench/codecs/codecs.py" --cleave "$build/apps/cleave" "$@"
