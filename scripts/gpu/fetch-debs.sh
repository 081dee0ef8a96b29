#!/usr/bin/env bash
# Downloads (without installing) the Debian packages that the core + backends + tests + bench
# build needs, and Fashion-MNIST, into .deps/debs, so that scripts/gpu/run.sh can build on a
# GPU machine that has CUDA but neither network nor these packages. Run on a Debian 12 machine
# with apt access, from anywhere in the repository. About 50 MB.
# Usage: scripts/gpu/fetch-debs.sh [--no-data]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest="$root/.deps/debs"
pkgs=(
  # core
  nlohmann-json3-dev zlib1g-dev zlib1g libfmt-dev libfmt9 libspdlog-dev libspdlog1.10
  # tests
  doctest-dev
  # onednn backend (the CPU peer of the benchmark): its CMake config needs OpenCL too
  libdnnl-dev libdnnl2 ocl-icd-opencl-dev ocl-icd-libopencl1 opencl-c-headers opencl-clhpp-headers
  # vulkan backend on the GPU's own Vulkan driver: the loader, headers and the shader compiler
  libvulkan1 libvulkan-dev glslc libshaderc1
)
[ "${1:-}" = --no-data ] || pkgs+=(dataset-fashion-mnist)
mkdir -p "$dest"
cd "$dest"
rm -f ./*.deb
if ! apt-get download "${pkgs[@]}"; then
  echo "fetch-debs: download failed; refreshing the package lists and trying again" >&2
  apt-get update -q
  apt-get download "${pkgs[@]}"
fi
echo "fetch-debs: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in $dest"
