#!/usr/bin/env bash
# Deep fuzzing outside CI: the CTest fuzz target (frames, messages, model specs; libFuzzer, ASan,
# UBSan), built the same way, run for a number of executions on one worker.
#
# Usage: bench/fuzz/run.sh [EXECUTIONS]           (default 10000000)
# Environment:
#   CLEAVE_FUZZ_BUILD_DIR      build, corpus and artifacts (default: <repo>/build-fuzz; the corpus
#                              is kept and grows from run to run)
#   CLEAVE_FUZZ_MAX_SECONDS    stop after this many seconds even if EXECUTIONS are not reached
#   CLEAVE_FUZZ_GENERATED_DIR  the main build's FlatBuffers header dir (default: flatc runs here)
#   CLEAVE_FUZZ_SEEDS_TOOL     the main build's make_fuzz_seeds, which writes the seeds with the
#                              protocol's builders (default: <repo>/build/tests/transport/fuzz/
#                              make_fuzz_seeds; build it with `cmake --build build --target make_fuzz_seeds`)
#   CLEAVE_FUZZ_CLANGXX        clang++ to use (default clang++), CLEAVE_FUZZ_BUILD_JOBS (default 2)
# Prints the executions, exec/s, corpus size and findings (0, or the artifact paths: inputs that
# crash, trip a sanitizer, throw anything but core::error, run over 10 s or use over 2 GiB); exits
# 1 on any finding, 77 when clang's libFuzzer is missing.
set -euo pipefail
runs=${1:-10000000}
here="$(cd "$(dirname "$0")" && pwd)"
source_dir="$(cd "$here/../.." && pwd)"
build=${CLEAVE_FUZZ_BUILD_DIR:-$source_dir/build-fuzz}
generator=Ninja
command -v ninja >/dev/null 2>&1 || generator="Unix Makefiles"
. "$source_dir/tests/transport/fuzz/common.sh"

status=0
fuzz_build "$build" "${CLEAVE_FUZZ_CLANGXX:-clang++}" "$source_dir" "${CLEAVE_FUZZ_GENERATED_DIR:-}" cmake "$generator" \
  "${CLEAVE_FUZZ_SEEDS_TOOL:-$source_dir/build/tests/transport/fuzz/make_fuzz_seeds}" ||
  status=$?
[ "$status" -eq 0 ] || exit "$status"

artifacts="$build/artifacts/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$artifacts"
log="$artifacts/fuzz.log"
limit=()
[ -n "${CLEAVE_FUZZ_MAX_SECONDS:-}" ] && limit=(-max_total_time="$CLEAVE_FUZZ_MAX_SECONDS")
echo "fuzz: $(ls "$build/seeds" | wc -l) seeds, $(ls "$build/corpus" | wc -l) corpus files, $runs executions; log $log"
start=$(date +%s)
fuzz_status=0
fuzz_run "$build" "$artifacts/" -runs="$runs" "${limit[@]}" >"$log" 2>&1 || fuzz_status=$?
seconds=$(($(date +%s) - start))

stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
findings=()
for f in "$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-*; do
  [ -e "$f" ] && findings+=("$f")
done
echo "executions: $(stat number_of_executed_units)"
echo "exec/s:     $(stat average_exec_per_sec)"
echo "seconds:    $seconds"
# libFuzzer's corpus in use (inputs/bytes), and the files its folder has gathered over all runs.
corp=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -1 | sed 's/corp: //' || true)
[ -n "$corp" ] && corp="${corp%%/*} inputs, ${corp#*/}" || corp="not loaded"
echo "corpus:     $corp ($(ls "$build/corpus" | wc -l) files in $build/corpus)"
echo "peak RSS:   $(stat peak_rss_mb) MB"
if [ "${#findings[@]}" -eq 0 ] && [ "$fuzz_status" -eq 0 ]; then
  echo "findings:   0"
  exit 0
fi
if [ "${#findings[@]}" -eq 0 ]; then
  echo "findings:   none written, but libFuzzer exited with status $fuzz_status: see $log"
  exit 1
fi
echo "findings:   ${#findings[@]}"
for f in "${findings[@]}"; do echo "  $f"; done
grep -m1 -E 'ERROR: |runtime error|terminate called|property violated' "$log" || true
exit 1
