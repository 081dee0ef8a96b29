#!/usr/bin/env bash
# Secure aggregation's cost per round: `cleave demo` with N devices (default 16) straight to the
# server, a fixed split, plain and with --secure-aggregation, one after the other in one run;
# prints each run's mean round time (rounds after the first), their ratio and the target (<= 2x),
# and the final test accuracy of both. Usage: bench/privacy/run.sh [DEVICES] [ROUNDS] [LOCAL_STEPS]
# BUILD (default build) names the build directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$root/build}
[ -x "$build/apps/cleave" ] || "$root/scripts/build.sh" >/dev/null
exec python3 "$root/bench/privacy/secagg_round.py" --cleave "$build/apps/cleave" "$@"
