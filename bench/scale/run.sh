#!/usr/bin/env bash
# Federations of many devices on this machine, through `cleave demo`: N device processes behind
# 4 edges (N = 16, 64, 256; the largest runs 20 further rounds to show the server's memory flat)
# and 1000 virtual devices (threads of one process, each with its own TLS channel) straight to
# the server. LeNet-5 on Fashion-MNIST, 1 local step per round. Prints per run: the join time
# (nodes started -> round 1 started with every device), the mean round time, whether every device
# was in every round, the server's resident set over the rounds from round 3 on and its peak,
# and the devices' peak resident set.
# Usage: bench/scale/run.sh [--quick]   (--quick: N = 16 and 64 processes, 200 virtual devices)
# BUILD (default build) names the build directory; WORK (default a temporary one) keeps the runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$root/build}
[ -x "$build/apps/cleave" ] || "$root/scripts/build.sh" >/dev/null
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
runs=("16 4 3" "64 4 3" "256 4 23" "1000 v 2")
[ "${1:-}" = --quick ] && runs=("16 4 3" "64 4 3" "200 v 2")

printf '%-6s %-22s %8s %8s %10s %-28s %10s %-22s\n' N nodes "join s" "round s" "all in" \
  "server RSS (rounds 3..)" "srv peak" "device peak RSS"
for r in "${runs[@]}"; do
  read -r n e rounds <<<"$r"
  dir=$work/scale-$n-$e
  rm -rf "$dir"
  args=(demo --no-emulation --devices "$n" --rounds "$rounds" --local-steps 1 --work "$dir")
  if [ "$e" = v ]; then
    args+=(--virtual --edges 0)
    nodes="virtual, no edges"
  else
    args+=(--edges "$e")
    nodes="processes, $e edges"
  fi
  out=$dir.log
  if ! "$build/apps/cleave" "${args[@]}" >"$out" 2>&1; then
    echo "run.sh: cleave ${args[*]} failed; its output: $out" >&2
    exit 1
  fi
  join=$(sed -nE 's/.*demo: .*joined in ([0-9.]+) s; [0-9]+ rounds, ([0-9.]+) s per round.*/\1/p' "$out")
  round=$(sed -nE 's/.*joined in [0-9.]+ s; [0-9]+ rounds, ([0-9.]+) s per round.*/\1/p' "$out")
  full=$(grep -cE "round [0-9]+/$rounds: $n/$n devices" "$out" || true)
  srv=$(sed -nE 's/.*demo: server resident ([0-9]+-[0-9]+ MiB) over rounds ([0-9]+-[0-9]+) \(([-+0-9.]+%)\), peak ([0-9]+ MiB).*/\1 (\3)/p' "$out")
  peak=$(sed -nE 's/.*demo: server resident .*, peak ([0-9]+ MiB).*/\1/p' "$out")
  if [ "$e" = v ]; then
    dev=$(sed -nE 's/.*demo: devices: this process peaked at ([0-9]+ MiB) for [0-9]+ devices \(([0-9.]+ MiB) each\).*/\2 each (\1 in all)/p' "$out")
  else
    dev=$(sed -nE 's/.*demo: device processes peaked at (.*)/\1/p' "$out")
  fi
  printf '%-6s %-22s %8s %8s %10s %-28s %10s %-22s\n' "$n" "$nodes" "$join" "$round" "$full/$rounds" "$srv" "$peak" "$dev"
done
echo "targets: 256 processes join in < 60 s, every device in every round, server RSS within 5% over 20 rounds;"
echo "         1000 virtual devices complete a round with the server's RSS <= 2 GB"
