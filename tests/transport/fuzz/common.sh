# shellcheck shell=bash
# The one build and run path of the fuzz target, sourced by run_fuzz.sh (the CTest test) and
# bench/fuzz/run.sh (deep runs): builds with clang (libFuzzer + ASan + UBSan), writes the seeds.

fuzz_project_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/project"

# fuzz_build BUILD_DIR CLANGXX SOURCE_DIR GENERATED_DIR CMAKE GENERATOR SEEDS_TOOL
# GENERATED_DIR: the main build's FlatBuffers header dir, or "" to run flatc here. SEEDS_TOOL: the
# main build's make_fuzz_seeds (it writes every message with the protocol's builders). Returns 77
# when clang or its libFuzzer runtime is missing. Seeds go to BUILD_DIR/seeds.
fuzz_build() {
  local build=$1 clangxx=$2 source=$3 generated=$4 cmake=$5 generator=$6 seeds_tool=$7
  if [ -z "$clangxx" ] || ! command -v "$clangxx" >/dev/null 2>&1; then
    echo "fuzz: clang++ not found, skipped"
    return 77
  fi
  mkdir -p "$build" || return 1
  local probe="$build/probe.cpp"
  printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' >"$probe"
  if ! "$clangxx" -fsanitize=fuzzer,address,undefined "$probe" -o "$build/probe" >/dev/null 2>&1; then
    echo "fuzz: $clangxx cannot link libFuzzer with ASan/UBSan (libclang-rt missing?), skipped"
    return 77
  fi
  if [ ! -x "$seeds_tool" ]; then
    echo "fuzz: no seed writer at '$seeds_tool' (build the main build's make_fuzz_seeds target)"
    return 1
  fi
  "$cmake" -S "$fuzz_project_dir" -B "$build" -G "$generator" -DCMAKE_CXX_COMPILER="$clangxx" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLEAVE_SOURCE_DIR="$source" -DCLEAVE_GENERATED_DIR="$generated" >/dev/null &&
    "$cmake" --build "$build" -j "${CLEAVE_FUZZ_BUILD_JOBS:-2}" || return 1
  rm -rf "$build/seeds"
  mkdir -p "$build/seeds" "$build/corpus" || return 1
  "$seeds_tool" "$build/seeds" || return 1
}

# fuzz_run BUILD_DIR ARTIFACT_PREFIX LIBFUZZER_ARGS...
# One worker on BUILD_DIR/corpus (kept between runs) and the seeds. Findings: a sanitizer report,
# an abort or uncaught exception, an input over 10 s, over 2 GiB of RSS; each leaves an artifact.
fuzz_run() {
  local build=$1 prefix=$2
  shift 2
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
    "$build/fuzz_frames" -artifact_prefix="$prefix" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 "$@" "$build/corpus" "$build/seeds"
}
