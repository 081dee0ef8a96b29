#!/usr/bin/env bash
# Split/local step-time ratios of two bench_split builds (e.g. before and after a change),
# measured in one run: the two binaries alternate, REPS times each, and the medians are printed.
# Usage: bench/split/compare.sh OLD_BENCH_SPLIT NEW_BENCH_SPLIT [REPS] [bench_split options...]
set -euo pipefail
old=${1:?old bench_split binary}
new=${2:?new bench_split binary}
reps=${3:-3}
shift 3 2>/dev/null || shift $#
opts=("$@")
[ ${#opts[@]} -gt 0 ] || opts=(--steps 200 --micro-batches 4)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((i = 1; i <= reps; i++)); do
  for which in old new; do
    bin=$old
    [ "$which" = new ] && bin=$new
    "$bin" "${opts[@]}" 2>/dev/null | tee -a "$out/$which.txt" | sed "s/^/[$which $i] /"
  done
done
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
for which in old new; do
  two=$(grep '2-tier' "$out/$which.txt" | sed 's/.*split\/local \([0-9.]*\).*/\1/' | median)
  three=$(grep '3-tier' "$out/$which.txt" | sed 's/.*split\/local \([0-9.]*\).*/\1/' | median)
  local_ms=$(grep '^  local' "$out/$which.txt" | awk '{print $2}' | median)
  echo "$which: median of $reps: local $local_ms ms/step, 2-tier/local $two, 3-tier/local $three"
done
