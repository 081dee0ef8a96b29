#!/usr/bin/env bash
# The arm64 Debian package that scripts/cross-arm64.sh makes (BUILD_DIR/packages/): architecture
# arm64, the same files as the package of this machine's architecture would hold, dependencies
# on the arm64 libraries, and its binary an aarch64 executable that runs here under qemu-user.
# Usage: test_deb_arm64.sh BUILD_DIR (the arm64 build tree). Exits 77 (skipped) without it.
set -euo pipefail
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -d "$1/packages" ] || skip "no arm64 packages in $1 (scripts/cross-arm64.sh makes them)"
command -v qemu-aarch64-static >/dev/null || skip "qemu-aarch64-static is not installed"
deb=$(ls "$1"/packages/cleave_*_arm64.deb 2>/dev/null | head -1)
[ -n "$deb" ] || fail "no cleave_*_arm64.deb in $1/packages"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dpkg-deb -I "$deb"
[ "$(dpkg-deb -f "$deb" Architecture)" = arm64 ] || fail "architecture $(dpkg-deb -f "$deb" Architecture)"
for lib in libssl3 libdnnl2 libc6; do
  dpkg-deb -f "$deb" Depends | grep -q "$lib" || fail "Depends does not name $lib: $(dpkg-deb -f "$deb" Depends)"
done
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's#^\./#/#' | grep -v '/$' | sort >"$work/files"
diff -u "$(dirname "$0")/package-files.txt" "$work/files" || fail "the package's files differ from package-files.txt"
dpkg-deb -x "$deb" "$work/root"
kind=$(file -b "$work/root/usr/bin/cleave")
case "$kind" in *"ARM aarch64"*) ;; *) fail "usr/bin/cleave is $kind" ;; esac
qemu-aarch64-static "$work/root/usr/bin/cleave" --help >"$work/help" || fail "the arm64 cleave --help failed under qemu"
grep -q '^  agent ' "$work/help" || { cat "$work/help"; fail "no agent command in its --help"; }
echo "PASS: $(basename "$deb"): $kind; runs under qemu"
