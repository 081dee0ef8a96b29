#!/usr/bin/env bash
# Runs the CUDA benchmark and, where PyTorch with CUDA is present, the same networks in
# PyTorch, printing cleave (cuda and its CPU peer) and PyTorch side by side from one run.
# Usage: bench/cuda/run_bench.sh BUILD_DIR [extra cuda_bench args, e.g. --tf32]
set -euo pipefail
build=${1:?usage: run_bench.sh BUILD_DIR [args]}
shift
here=$(cd "$(dirname "$0")" && pwd)
exe="$build/bench/cuda/cleave_bench_cuda"
[ -x "$exe" ] || { echo "run_bench: $exe not built" >&2; exit 2; }
json=$(mktemp)
trap 'rm -f "$json"' EXIT
"$exe" --json "$json" "$@"
[ -s "$json" ] || exit 0  # no GPU: the program said so
py=${PYTHON:-python3}
if "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  tf32=()
  for a in "$@"; do [ "$a" = --tf32 ] && tf32=(--tf32); done
  "$py" "$here/torch_bench.py" --cleave "$json" "${tf32[@]}"
else
  echo "run_bench: PyTorch with CUDA not available; PyTorch comparison skipped"
fi
