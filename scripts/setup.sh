#!/usr/bin/env bash
# Installs the Debian packages cleave needs that are not installed yet.
# Usage: scripts/setup.sh [extra-package-list-file...]  (idempotent; no apt call when all are present)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lists=("$here/debian-packages.txt" "$@")
missing=()
for list in "${lists[@]}"; do
  [ -f "$list" ] || { echo "setup: package list not found: $list" >&2; exit 2; }
  while read -r pkg _; do
    case "$pkg" in ''|'#'*) continue ;; esac
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing+=("$pkg")
  done <"$list"
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
