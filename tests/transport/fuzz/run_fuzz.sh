#!/usr/bin/env bash
# Builds the fuzz target (frames, messages, model specs) and runs it for a bounded time (CTest).
# Usage: run_fuzz.sh BUILD_DIR SECONDS CLANGXX SOURCE_DIR GENERATED_DIR CMAKE GENERATOR SEEDS_TOOL
set -euo pipefail
build=$1 seconds=$2 clangxx=$3 source=$4 generated=$5 cmake=$6 generator=$7 seeds_tool=$8
. "$(dirname "$0")/common.sh"
status=0
fuzz_build "$build" "$clangxx" "$source" "$generated" "$cmake" "$generator" "$seeds_tool" || status=$?
[ "$status" -eq 0 ] || exit "$status"
echo "fuzz: $(ls "$build/seeds" | wc -l) seeds, running ${seconds}s"
fuzz_run "$build" "$build/" -max_total_time="$seconds"
