#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (CTest).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
jobs=$(nproc 2>/dev/null || echo 2)
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
ctest --test-dir "$root/build" --output-on-failure -j "$jobs" "$@"
