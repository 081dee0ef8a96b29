#!/usr/bin/env bash
# LeNet-5 on Fashion-MNIST, batch 64, SGD lr 0.05 momentum 0.9, 2 threads: PyTorch (CPU,
# Debian's python3-torch) and cleave (onednn by default) side by side in one run, over several
# seeds (one epoch's accuracy varies by a point or two with the seed); prints images/s and
# test accuracy of both (per seed and mean) and the ratios.
# Usage: bench/lenet/run.sh [epochs] [cleave backend] [seeds]   (builds if needed)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
epochs=${1:-1}
backend=${2:-onednn}
seeds=${3:-3}
"$root/scripts/setup.sh" "$root/bench/lenet/packages.txt" >/dev/null
[ -x "$root/build/bench/lenet/bench_train" ] || "$root/scripts/build.sh" >/dev/null
cmake --build "$root/build" --target bench_train >/dev/null
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=2
results=()
for seed in $(seq 1 "$seeds"); do
  echo "seed $seed: PyTorch CPU, then cleave $backend, $epochs epoch(s) each..." >&2
  results+=("$(/usr/bin/python3 "$root/bench/lenet/torch_lenet.py" --epochs "$epochs" --threads 2 --seed "$seed")")
  results+=("$("$root/build/bench/lenet/bench_train" --backend "$backend" --epochs "$epochs" --seed "$seed" 2>/dev/null)")
done
/usr/bin/python3 - "${results[@]}" <<'PY'
import json, sys
rows = [json.loads(a) for a in sys.argv[1:]]
t = [r for r in rows if r["framework"] == "pytorch"]
c = [r for r in rows if r["framework"] == "cleave"]
mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)
print(f"{'':8} {'seed':>4} {'images/s':>10} {'test acc':>9}")
for i, (a, b) in enumerate(zip(t, c), 1):
    print(f"{'pytorch':8} {i:>4} {a['images_per_s']:>10.0f} {a['test_accuracy']:>9.4f}")
    print(f"{'cleave':8} {i:>4} {b['images_per_s']:>10.0f} {b['test_accuracy']:>9.4f}   ({b['backend']})")
ti, ci = mean(t, "images_per_s"), mean(c, "images_per_s")
ta, ca = mean(t, "test_accuracy"), mean(c, "test_accuracy")
print(f"mean: pytorch {ti:.0f} img/s acc {ta:.4f}; cleave {ci:.0f} img/s acc {ca:.4f}")
print(f"throughput ratio cleave/pytorch: {ci / ti:.2f}x (target >= 1.0); "
      f"accuracy difference: {100 * (ca - ta):+.2f} points (target within 1.5)")
PY
