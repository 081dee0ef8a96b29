#!/usr/bin/env bash
# The zoo models (lenet5, resnet8, resnet18, mobilenetv2, vgg11-bn) trained on Fashion-MNIST,
# batch 64, SGD momentum, 2 threads: PyTorch (CPU, Debian's python3-torch) and cleave (onednn)
# side by side in one run; prints images/s, peak RSS and wall time of both and the ratios
# cleave/pytorch against the targets. A model cleave's zoo does not have yet is listed as skipped.
# Usage: bench/models/run.sh [--steps N] [--warmup N] [--epochs E] [--lr-schedule cosine] [--models a,b] [--data DIR]
#                            [--batch N] [--threads N]      (builds bench_models if needed)
# BUILD (default build) names the build directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$root/build}
"$root/scripts/setup.sh" "$root/bench/models/packages.txt" >/dev/null ||
  echo "run.sh: could not install the PyTorch peer's packages (bench/models/packages.txt)" >&2
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "run.sh: PyTorch is not importable by /usr/bin/python3 (install python3-torch): skipped" >&2
  exit 77
fi
[ -d "$build" ] || "$root/scripts/build.sh" >/dev/null
cmake --build "$build" --target bench_models >/dev/null
exec /usr/bin/python3 "$root/bench/models/compare.py" --cleave "$build/bench/models/bench_models" "$@"
