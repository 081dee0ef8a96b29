#!/usr/bin/env bash
# Cross-builds the `cleave` binary for arm64 (aarch64) Linux with Debian's cross toolchain:
# oneDNN and the Vulkan loader of the arm64 packages, CUDA, tests and benchmarks off.
# Installs what is missing first (scripts/debian-packages-arm64.txt through scripts/setup.sh).
# Usage: scripts/cross-arm64.sh [BUILD_DIR] [extra CMake configure arguments...]
#   BUILD_DIR defaults to build-arm64/ in the repository. The result is BUILD_DIR/apps/cleave;
#   run it here with `qemu-aarch64-static BUILD_DIR/apps/cleave` (no -L: see the toolchain file),
#   and its Debian package BUILD_DIR/packages/cleave_VERSION_arm64.deb (packaging/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-arm64}
[ $# -gt 0 ] && shift
mkdir -p "$build"
build=$(cd "$build" && pwd)
list="$root/scripts/debian-packages-arm64.txt"

"$root/scripts/setup.sh" "$list"

# Packages tagged `sysroot` in the list: the arm64 -dev package unpacked into BUILD_DIR/sysroot,
# at the version of its installed runtime, whose libraries it links (found through
# CMAKE_PREFIX_PATH before the system's). A stamp file per package skips the download next time.
sysroot="$build/sysroot"
while read -r pkg tag _; do
  case "$pkg" in ''|'#'*) continue ;; esac
  [ "${tag:-}" = sysroot ] || continue
  name=${pkg%%:*} arch=${pkg##*:}
  # Its runtime library package: the -dev package's dependency of the same source.
  runtime=$(apt-cache depends "$pkg" | awk '/Depends:/ {print $2; exit}')
  version=$(dpkg-query -W -f='${Version}' "$runtime" 2>/dev/null || true)
  [ -n "$version" ] || { echo "cross-arm64: $runtime (needed by $pkg) is not installed" >&2; exit 2; }
  stamp="$sysroot/.$name-$arch"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$version" ]; then
    echo "cross-arm64: unpacking $pkg $version into $sysroot"
    tmp=$(mktemp -d)
    chmod 0777 "$tmp"  # apt-get download writes as _apt when run as root
    (cd "$tmp" && apt-get download -q "$pkg=$version") ||
      { rm -rf "$tmp"; echo "cross-arm64: apt-get download $pkg=$version failed" >&2; exit 2; }
    dpkg -x "$tmp"/*.deb "$sysroot"
    rm -rf "$tmp"
    # The unpacked development links point to the runtime's files beside them: link those to
    # the installed runtime.
    for lib in $(dpkg -L "$runtime" | grep -E '/lib/[^/]+/[^/]+\.so[.0-9]*$'); do
      mkdir -p "$sysroot$(dirname "$lib")"
      ln -sfn "$lib" "$sysroot$lib"
    done
    echo "$version" >"$stamp"
  fi
done <"$list"

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$root/cmake/toolchains/aarch64-linux-gnu.cmake" \
  -DCMAKE_PREFIX_PATH="$sysroot/usr" \
  -DCLEAVE_WITH_ONEDNN=ON -DCLEAVE_WITH_VULKAN=ON -DCLEAVE_WITH_CUDA=OFF -DCLEAVE_WITH_NET=ON \
  -DCLEAVE_BUILD_TESTS=OFF -DCLEAVE_BUILD_BENCH=OFF "$@"
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build "$build" -j "$jobs" --target cleave cleave_manpage

bin="$build/apps/cleave"
kind=$(file -b "$bin")
case "$kind" in
  *"ARM aarch64"*) echo "cross-arm64: $bin: $kind" ;;
  *) echo "cross-arm64: $bin is not an arm64 executable: $kind" >&2; exit 1 ;;
esac

# The Debian package: its Depends from the arm64 libraries the binary links (dpkg-shlibdeps reads
# the multiarch runtime packages installed above).
cpack --config "$build/CPackConfig.cmake" -B "$build/packages" >"$build/cpack.log" 2>&1 ||
  { cat "$build/cpack.log" >&2; echo "cross-arm64: cpack failed" >&2; exit 1; }
echo "cross-arm64: $(ls "$build"/packages/cleave_*_arm64.deb)"
