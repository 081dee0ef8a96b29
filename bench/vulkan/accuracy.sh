#!/usr/bin/env bash
# One epoch of LeNet-5 on Fashion-MNIST (batch 64, SGD lr 0.05 momentum 0.9, cosine decay over
# the epoch) on vulkan and on onednn with the same seeds, side by side; prints both test
# accuracies per seed and their difference (target: within 0.5 points). As a yardstick for
# how far rounding alone moves one epoch, onednn also runs on 1 and on 2 threads (its
# reductions then add in different orders).
# Usage: bench/vulkan/accuracy.sh [seeds] [vulkan device]   (default: "1 2", vulkan)
# On lavapipe (CPU Vulkan) an epoch takes 10-15 minutes; on a GPU seconds.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seeds=${1:-1 2}
vk=${2:-vulkan}
[ -x "$root/build/bench/lenet/bench_train" ] || "$root/scripts/build.sh" >/dev/null
cmake --build "$root/build" --target bench_train >/dev/null
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
train() {
  local threads=$1
  shift
  OMP_NUM_THREADS=$threads "$root/build/bench/lenet/bench_train" --epochs 1 --schedule cosine "$@" 2>/dev/null
}
rows=()
for seed in $seeds; do
  echo "seed $seed: onednn on 2 and 1 threads, then $vk (one epoch each)..." >&2
  rows+=("$seed $(train 2 --backend onednn:2 --seed "$seed")")
  rows+=("$seed $(train 1 --backend onednn:1 --seed "$seed")")
  rows+=("$seed $(train 2 --backend "$vk" --seed "$seed")")
done
/usr/bin/python3 - "${rows[@]}" <<'PY'
import json, sys
by_seed = {}
for a in sys.argv[1:]:
    seed, text = a.split(" ", 1)
    by_seed.setdefault(seed, []).append(json.loads(text))
print(f"{'seed':>4} {'onednn:2':>9} {'onednn:1':>9} {'vulkan':>9} {'vk-dnn':>7} {'dnn1-dnn2':>9} {'vk img/s':>9}")
worst = 0.0
for seed, (d2, d1, vk) in by_seed.items():
    diff = 100 * (vk["test_accuracy"] - d2["test_accuracy"])
    floor = 100 * (d1["test_accuracy"] - d2["test_accuracy"])
    worst = max(worst, abs(diff))
    print(f"{seed:>4} {d2['test_accuracy']:>9.4f} {d1['test_accuracy']:>9.4f} {vk['test_accuracy']:>9.4f} "
          f"{diff:>+7.2f} {floor:>+9.2f} {vk['images_per_s']:>9.0f}")
print(f"largest |vulkan - onednn|: {worst:.2f} points (target within 0.5) "
      f"on {len(by_seed)} seed(s); differences in points")
PY
