#!/usr/bin/env bash
# Installs what is missing, builds, cross-builds the arm64 cleave (scripts/cross-arm64.sh, into
# build-arm64/; CLEAVE_ARM64=0 leaves it out and its test skips), and runs the whole test suite
# (CTest), the arm64 agent under qemu-user included.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
if [ "${CLEAVE_ARM64:-1}" != 0 ]; then
  "$root/scripts/cross-arm64.sh" "$root/build-arm64"
fi
jobs=$(nproc 2>/dev/null || echo 2)
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
# setup.sh installs Chromium: the dashboard test must not skip for want of it.
export CLEAVE_REQUIRE_BROWSER=1
# ...and Prometheus's promtool (the prometheus package), which lints every node's /metrics.
export CLEAVE_REQUIRE_PROMTOOL=1
ctest --test-dir "$root/build" --output-on-failure -j "$jobs" "$@"
