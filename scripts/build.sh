#!/usr/bin/env bash
# Installs missing Debian packages (scripts/setup.sh), then configures and builds cleave in
# build/ (Release, Ninja). Extra arguments go to CMake's configure step. CLEAVE_TARGETS names
# the targets to build (space-separated; default: all of them, every test and benchmark).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
targets=()
for t in ${CLEAVE_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$root/build" -j "$jobs" "${targets[@]}"
