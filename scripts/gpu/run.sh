#!/usr/bin/env bash
# Builds and checks cleave on a GPU machine that has CUDA (nvcc, cuBLAS), cuDNN (system or a
# Python wheel), CMake and ninja but none of our Debian packages and no network. Run from the
# repository root after scripts/gpu/fetch-debs.sh filled .deps/debs (carry .deps/debs along).
#   1. unpacks the .debs into .deps/root (never into /) and makes them relocatable;
#   2. configures and builds core + backends + tests + bench with CUDA for sm_90, and Vulkan
#      on the GPU's own Vulkan driver (its ICD file, or one written for libGLX_nvidia.so.0);
#   3. runs ctest (conformance of every backend against reference, gradient checks, the cuda
#      and vulkan suites), then the GPU benchmarks (cuda vs onednn, and PyTorch when it is
#      there; vulkan vs the other backends);
#   4. trains LeNet-5 and ResNet-8 for one Fashion-MNIST epoch on cuda, onednn and PyTorch
#      (bench/lenet/bench_train, bench/cuda/torch_train.py) and prints images/s and accuracy;
#      LeNet-5 also on vulkan against onednn with the same seed (cosine decay, as in
#      bench/vulkan/accuracy.sh);
#   5. times training steps of resnet18, mobilenetv2 and vgg11-bn on cuda, vulkan and onednn
#      (bench/models/bench_models, one JSON line each).
# Logs go to $OUT (default .gpu-out): env.txt, configure.log, build.log, ctest.log,
# ctest-junit.xml, bench.log, train.log, train.jsonl, models.jsonl, summary.txt.
# Usage: scripts/gpu/run.sh [--jobs N] [--skip-build] [--tests-only] [--bench-only]
set -uo pipefail

root=$(pwd)
[ -f "$root/backends/cuda/CMakeLists.txt" ] || { echo "run.sh: run from the repository root" >&2; exit 2; }
OUT=${OUT:-$root/.gpu-out}
mkdir -p "$OUT"
jobs=$(nproc 2>/dev/null || echo 8)
build="$root/build-gpu"
do_build=1 do_tests=1 do_bench=1
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs=$2; shift ;;
    --skip-build) do_build=0 ;;
    --tests-only) do_bench=0 ;;
    --bench-only) do_tests=0 ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

summary="$OUT/summary.txt"
: >"$summary"
note() { echo "run.sh: $*" | tee -a "$summary"; }
started=$(date +%s)
elapsed() { echo "$(($(date +%s) - started))s"; }

# ---- 1. unpack the Debian packages into .deps/root ------------------------------------------
deps="$root/.deps"
prefix="$deps/root/usr"
debs=("$deps"/debs/*.deb)
if [ ! -e "${debs[0]}" ]; then
  note "no packages in .deps/debs (run scripts/gpu/fetch-debs.sh where apt works, and carry .deps/debs)"
  exit 2
fi
if [ "$(cat "$deps/root/.unpacked" 2>/dev/null)" != "$deps/root" ]; then  # unpacked here, at this path?
  rm -rf "$deps/root"
  mkdir -p "$deps/root"
  for f in "${debs[@]}"; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$deps/root"
    else  # no dpkg: a .deb is an ar archive holding data.tar.*
      tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$f") && tar -xf "$tmp"/data.tar.* -C "$deps/root"
      rm -rf "$tmp"
    fi
  done
  # Absolute symlinks (e.g. libz.so -> /lib/...) point into .deps/root instead.
  while IFS= read -r link; do
    target=$(readlink "$link")
    case "$target" in /*) [ -e "$deps/root$target" ] && ln -sfn "$deps/root$target" "$link" ;; esac
  done < <(find "$deps/root" -type l)
  # Package configs that hard-code the /usr prefix are pointed at .deps/root/usr.
  grep -rl 'set(_IMPORT_PREFIX "/usr")' "$deps/root" --include='*.cmake' 2>/dev/null |
    xargs -r sed -i "s|set(_IMPORT_PREFIX \"/usr\")|set(_IMPORT_PREFIX \"$prefix\")|"
  echo "$deps/root" >"$deps/root/.unpacked"
fi
note "unpacked ${#debs[@]} packages into $deps/root ($(elapsed))"

# ---- 2. environment: CUDA, cuDNN, libraries ---------------------------------------------------
cuda_home=${CUDA_HOME:-/usr/local/cuda}
[ -x "$cuda_home/bin/nvcc" ] || cuda_home=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")
export PATH="$cuda_home/bin:$PATH"
export CUDACXX="$cuda_home/bin/nvcc"
py=${PYTHON:-python3}
# cuDNN: the toolkit's or the system's, else the Python wheel's (nvidia-cudnn-cu13).
cudnn_root=${CUDNN_ROOT:-}
if [ -z "$cudnn_root" ]; then
  for d in "$cuda_home" /usr /usr/local; do
    if [ -f "$d/include/cudnn.h" ] || [ -f "$d/include/x86_64-linux-gnu/cudnn.h" ]; then cudnn_root=$d; break; fi
  done
fi
if [ -z "$cudnn_root" ]; then
  cudnn_root=$("$py" -c 'import nvidia.cudnn as m, os; print(list(m.__path__)[0])' 2>/dev/null || true)
fi
# Our programs find the .deps libraries' own dependencies (libfmt for libspdlog, libOpenCL for
# libdnnl) and cuDNN's sub-libraries through LD_LIBRARY_PATH. Debian's zlib only if the system
# has none, the toolkit's lib64 only if the loader does not know it. Python (PyTorch brings its
# own CUDA libraries) runs with the environment it came with, through a small wrapper.
orig_ld=${LD_LIBRARY_PATH:-}
libdirs="$prefix/lib/x86_64-linux-gnu"
ldconfig -p 2>/dev/null | grep -q 'libz\.so\.1 ' || libdirs="$libdirs:$deps/root/lib/x86_64-linux-gnu"
ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.13 ' || libdirs="$libdirs:$cuda_home/lib64"
[ -n "$cudnn_root" ] && [ -d "$cudnn_root/lib" ] && libdirs="$libdirs:$cudnn_root/lib"
export LD_LIBRARY_PATH="$libdirs${orig_ld:+:$orig_ld}"
mkdir -p "$build"
real_py=$(command -v "$py" || echo "$py")
printf '#!/bin/sh\n%s\nexec "%s" "$@"\n' \
  "$([ -n "$orig_ld" ] && echo "export LD_LIBRARY_PATH='$orig_ld'" || echo "unset LD_LIBRARY_PATH")" "$real_py" \
  >"$build/python3-plain"
chmod +x "$build/python3-plain"
py="$build/python3-plain"
export CMAKE_PREFIX_PATH="$prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
{
  echo "date: $(date -u)"
  echo "git: $(git -C "$root" log --oneline -1 2>/dev/null)"
  echo "nvcc: $("$CUDACXX" --version 2>&1 | tail -2 | tr '\n' ' ')"
  echo "cmake: $(cmake --version | head -1)  ninja: $(ninja --version 2>&1 || echo none)"
  echo "c++: $(c++ --version 2>&1 | head -1)"
  echo "cudnn root: ${cudnn_root:-not found}"
  echo "toolkit libraries: $(ls "$cuda_home/lib64" 2>/dev/null | grep -E '^lib(cudart|cublas|cudnn)\.so' | tr '\n' ' ')"
  echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH"
  nvidia-smi 2>&1 || echo "nvidia-smi failed"
} >"$OUT/env.txt" 2>&1
note "cuda at $cuda_home, cudnn at ${cudnn_root:-not found}"
# The NVIDIA Vulkan driver: its ICD file where the driver installed one, else one written for
# its library when the loader can find that (containers often carry the library only).
vk_icd=""
for f in /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json \
  /usr/share/vulkan/icd.d/nvidia_icd.x86_64.json; do
  [ -f "$f" ] && { vk_icd=$f; break; }
done
if [ -z "$vk_icd" ]; then
  glx=$(ldconfig -p 2>/dev/null | awk '/libGLX_nvidia\.so\.0 /{print $NF; exit}')
  if [ -n "$glx" ]; then
    vk_icd="$build/nvidia_icd.json"
    printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.3.0"}}\n' \
      "$glx" >"$vk_icd"
  fi
fi
if [ -n "$vk_icd" ]; then
  export VK_ICD_FILENAMES="$vk_icd" XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
  note "vulkan driver: $vk_icd"
else
  note "vulkan driver: no NVIDIA Vulkan ICD or libGLX_nvidia.so.0 (the loader picks what it finds; none: vulkan tests skip)"
fi

# ---- 3. configure and build -------------------------------------------------------------------
if [ "$do_build" = 1 ]; then
  gen=Ninja
  command -v ninja >/dev/null || gen="Unix Makefiles"
  cmake_args=(-S "$root" -B "$build" -G "$gen" -DCMAKE_BUILD_TYPE=Release
    -DCLEAVE_WITH_CUDA=ON -DCLEAVE_WITH_NET=OFF -DCLEAVE_WITH_VULKAN=AUTO -DCLEAVE_WITH_ONEDNN=AUTO
    -DCLEAVE_TEST_VK_ICD="$vk_icd"
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$CUDACXX" -DCMAKE_PREFIX_PATH="$prefix")
  [ -n "$cudnn_root" ] && cmake_args+=(-DCUDNN_ROOT="$cudnn_root")
  if ! cmake "${cmake_args[@]}" >"$OUT/configure.log" 2>&1; then
    note "configure FAILED (see configure.log)"
    tail -30 "$OUT/configure.log"
    exit 1
  fi
  grep "cleave:" "$OUT/configure.log" | tee -a "$summary"
  if ! cmake --build "$build" -j "$jobs" >"$OUT/build.log" 2>&1; then
    note "build FAILED (see build.log)"
    grep -E "error|FAILED" "$OUT/build.log" | head -40
    exit 1
  fi
  note "built ($(elapsed))"
fi

status=0
# ---- 4. tests: conformance (every backend vs reference), gradient checks, cuda suite ----------
if [ "$do_tests" = 1 ]; then
  "$build/tests/cuda/test_cuda_registry" -s -tc="*unavailable*" 2>&1 | grep -E "MESSAGE|unavail" | tee -a "$summary"
  ctest --test-dir "$build" --output-on-failure -j 8 --timeout 300 --output-junit "$OUT/ctest-junit.xml" \
    >"$OUT/ctest.log" 2>&1
  rc=$?
  grep -E "tests passed|tests failed|Skipped|Failed|\*\*\*" "$OUT/ctest.log" | head -60 | tee -a "$summary"
  [ "$rc" = 0 ] || { note "ctest FAILED (rc $rc, see ctest.log)"; status=1; }
  note "tests done ($(elapsed))"
fi

# ---- 5. benchmark: cuda vs onednn (CPU), and PyTorch on the same GPU ---------------------------
if [ "$do_bench" = 1 ]; then
  {
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-$jobs} PYTHON="$py" bash "$root/bench/cuda/run_bench.sh" "$build"
    echo
    PYTHON="$py" bash "$root/bench/cuda/run_bench.sh" "$build" --tf32
  } >"$OUT/bench.log" 2>&1 || { note "benchmark FAILED (see bench.log)"; status=1; }
  cat "$OUT/bench.log" | tee -a "$summary"
  if [ -x "$build/bench/vulkan/bench_vulkan_ops" ]; then
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-$jobs} "$build/bench/vulkan/bench_vulkan_ops" >"$OUT/bench-vulkan.log" 2>&1 ||
      note "vulkan benchmark FAILED (see bench-vulkan.log)"
    tee -a "$summary" <"$OUT/bench-vulkan.log"
  fi
  note "benchmark done ($(elapsed))"

  # ---- 6. TRAINING: LeNet-5 and ResNet-8 on Fashion-MNIST, one epoch each ----------------------
  # bench/lenet/bench_train (the core trainer; prints one JSON line) on cuda and onednn, and
  # bench/cuda/torch_train.py (PyTorch on the same GPU, same JSON); then a table of the ratios.
  # onednn's ResNet-8 epoch is cut to 300 steps (its images/s is what is compared).
  trainer="$build/bench/lenet/bench_train"
  data="$deps/root/usr/share/datasets/fashion-mnist"
  if ! nvidia-smi -L >/dev/null 2>&1; then
    note "training step skipped: no GPU (nvidia-smi -L failed)"
  elif [ -x "$trainer" ] && [ -d "$data" ]; then
    train_json="$OUT/train.jsonl"
    : >"$train_json"
    for model in lenet5 resnet8; do
      echo "== $model"
      "$trainer" --backend cuda --model "$model" --data "$data" --epochs 1 >>"$train_json" || status=1
      cut=()
      [ "$model" = resnet8 ] && cut=(--max-steps 300)
      OMP_NUM_THREADS=${OMP_NUM_THREADS:-$jobs} "$trainer" --backend onednn --model "$model" --data "$data" \
        --epochs 1 "${cut[@]}" >>"$train_json" || echo "onednn run failed (backend not in this build?)"
      "$py" "$root/bench/cuda/torch_train.py" --model "$model" --data "$data" --epochs 1 >>"$train_json" ||
        echo "PyTorch run failed"
      if [ "$model" = lenet5 ] && [ -x "$build/bench/vulkan/bench_vulkan_ops" ]; then
        for b in vulkan onednn; do
          OMP_NUM_THREADS=${OMP_NUM_THREADS:-$jobs} "$trainer" --backend "$b" --model lenet5 --data "$data" \
            --epochs 1 --schedule cosine --seed 1 | sed 's/"framework": "cleave"/"framework": "cleave-cosine"/' \
            >>"$train_json" || echo "$b cosine run failed"
        done
      fi
    done >"$OUT/train.log" 2>&1
    "$py" - "$train_json" <<'PY' 2>&1 | tee -a "$OUT/train.log" "$summary"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
print(f"{'model':8} {'who':16} {'images/s':>10} {'test acc':>9} {'train s':>8}")
for model in ("lenet5", "resnet8"):
    mine = [r for r in rows if r["model"] == model]
    for r in mine:
        print(f"{model:8} {r['framework'] + ' ' + r['backend']:16} {r['images_per_s']:>10.0f} "
              f"{r['test_accuracy']:>9.4f} {r['train_seconds']:>8.1f}")
    cuda = next((r for r in mine if r["framework"] == "cleave" and r["backend"] == "cuda"), None)
    cos = {r["backend"]: r for r in mine if r["framework"] == "cleave-cosine"}
    if "vulkan" in cos and "onednn" in cos:
        print(f"{model:8} vulkan - onednn test accuracy (seed 1, cosine): "
              f"{100 * (cos['vulkan']['test_accuracy'] - cos['onednn']['test_accuracy']):+.2f} points")
    for peer in mine:
        if cuda and peer is not cuda and peer["framework"] != "cleave-cosine":
            print(f"{model:8} cleave cuda / {peer['framework']} {peer['backend']}: "
                  f"{cuda['images_per_s'] / peer['images_per_s']:.2f}x images/s")
PY
  else
    note "training step skipped: $trainer not built or $data missing"
  fi

  # ---- 7. the larger zoo models (grouped/depthwise convs, ReLU6): training steps per backend -----
  models_bench="$build/bench/models/bench_models"
  if nvidia-smi -L >/dev/null 2>&1 && [ -x "$models_bench" ] && [ -d "$data" ]; then
    for model in resnet18 mobilenetv2 vgg11-bn; do
      for b in cuda vulkan onednn; do
        steps=100
        [ "$b" = onednn ] && steps=10
        OMP_NUM_THREADS=${OMP_NUM_THREADS:-$jobs} "$models_bench" --backend "$b" --model "$model" --data "$data" \
          --steps "$steps" --warmup 3 2>/dev/null || echo "{\"model\": \"$model\", \"backend\": \"$b\", \"failed\": true}"
      done
    done >"$OUT/models.jsonl" 2>&1
    tee -a "$summary" <"$OUT/models.jsonl"
    note "zoo model steps done ($(elapsed))"
  fi
fi

note "finished in $(elapsed), status $status"
exit $status
