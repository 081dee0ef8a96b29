#!/usr/bin/env bash
# Builds the frame fuzz target with clang (libFuzzer + ASan + UBSan) and runs it for a bounded time.
# Usage: run_fuzz.sh PROJECT_DIR BUILD_DIR SECONDS CLANGXX SOURCE_DIR GENERATED_DIR CMAKE GENERATOR
set -euo pipefail
project=$1 build=$2 seconds=$3 clangxx=$4 source=$5 generated=$6 cmake=$7 generator=$8
if [ -z "$clangxx" ] || ! command -v "$clangxx" >/dev/null 2>&1; then
  echo "fuzz: clang++ not found, skipped"
  exit 77
fi
mkdir -p "$build"
probe="$build/probe.cpp"
printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' >"$probe"
if ! "$clangxx" -fsanitize=fuzzer,address,undefined "$probe" -o "$build/probe" >/dev/null 2>&1; then
  echo "fuzz: $clangxx cannot link libFuzzer with ASan/UBSan (libclang-rt missing?), skipped"
  exit 77
fi
"$cmake" -S "$project" -B "$build" -G "$generator" -DCMAKE_CXX_COMPILER="$clangxx" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLEAVE_SOURCE_DIR="$source" -DCLEAVE_GENERATED_DIR="$generated" >/dev/null
"$cmake" --build "$build" -j 2
seeds="$build/seeds"
corpus="$build/corpus"
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus"
"$build/make_fuzz_seeds" "$seeds"
echo "fuzz: $(ls "$seeds" | wc -l) seeds, running ${seconds}s"
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
exec "$build/fuzz_frames" -artifact_prefix="$build/" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
  -print_final_stats=1 "$corpus" "$seeds"
