#!/usr/bin/env bash
# Installs the Debian packages cleave needs that are not installed yet.
# Usage: scripts/setup.sh [extra-package-list-file...]  (idempotent; no apt call when all are present)
# A list names one package a line; NAME:ARCH adds the foreign architecture ARCH first (dpkg
# --add-architecture); a line whose second word is `sysroot` is skipped here (the script that
# uses that list unpacks it itself).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lists=("$here/debian-packages.txt" "$@")
native=$(dpkg --print-architecture)
missing=()
archs=()
for list in "${lists[@]}"; do
  [ -f "$list" ] || { echo "setup: package list not found: $list" >&2; exit 2; }
  while read -r pkg tag _; do
    case "$pkg" in ''|'#'*) continue ;; esac
    [ "${tag:-}" = sysroot ] && continue
    # (once a foreign architecture is added, a bare name can match one instance per architecture)
    case "$pkg" in *:*) want="${pkg##*:}" ;; *) want="$native|all" ;; esac
    dpkg-query -W -f='${Architecture} ${Status}\n' "${pkg%%:*}" 2>/dev/null |
      grep -Eqx "($want) install ok installed" && continue
    missing+=("$pkg")
    case "$pkg" in *:*) archs+=("${pkg##*:}") ;; esac
  done <"$list"
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
for arch in $(printf '%s\n' "${archs[@]}" | sort -u); do
  [ "$arch" = "$native" ] && continue
  if ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
    echo "setup: adding the $arch architecture (dpkg --add-architecture $arch)"
    $sudo dpkg --add-architecture "$arch"
  fi
done
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
