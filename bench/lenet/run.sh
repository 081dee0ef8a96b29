#!/usr/bin/env bash
# LeNet-5 on Fashion-MNIST, batch 64, SGD lr 0.05 momentum 0.9, 2 threads: PyTorch (CPU,
# Debian's python3-torch) and cleave (onednn by default) in one run; prints both and the ratio.
# Usage: bench/lenet/run.sh [epochs] [cleave backend]    (run from anywhere; builds if needed)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
epochs=${1:-1}
backend=${2:-onednn}
"$root/scripts/setup.sh" "$root/bench/lenet/packages.txt" >/dev/null
[ -x "$root/build/bench/lenet/bench_train" ] || "$root/scripts/build.sh" >/dev/null
cmake --build "$root/build" --target bench_train >/dev/null
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=2
echo "PyTorch CPU, ${epochs} epoch(s)..." >&2
torch_json=$(/usr/bin/python3 "$root/bench/lenet/torch_lenet.py" --epochs "$epochs" --threads 2)
echo "cleave ${backend}, ${epochs} epoch(s)..." >&2
cleave_json=$("$root/build/bench/lenet/bench_train" --backend "$backend" --epochs "$epochs")
/usr/bin/python3 - "$torch_json" "$cleave_json" <<'PY'
import json, sys
t, c = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"{'':10} {'images/s':>10} {'test acc':>9} {'train s':>8}")
print(f"{'pytorch':10} {t['images_per_s']:>10.0f} {t['test_accuracy']:>9.4f} {t['train_seconds']:>8.1f}")
print(f"{'cleave':10} {c['images_per_s']:>10.0f} {c['test_accuracy']:>9.4f} {c['train_seconds']:>8.1f}   ({c['backend']})")
print(f"throughput ratio cleave/pytorch: {c['images_per_s'] / t['images_per_s']:.2f}x; "
      f"accuracy difference: {100 * (c['test_accuracy'] - t['test_accuracy']):+.2f} points")
PY
