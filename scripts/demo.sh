#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs `cleave demo`: 1 server, 1 edge
# and 4 device agents as separate processes on loopback, emulating slow boards on Wi-Fi, training
# LeNet-5 on Fashion-MNIST split non-IID across the devices and across the tiers. Extra
# arguments go to `cleave demo`. Builds only the `cleave` binary (scripts/test.sh builds the rest).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
CLEAVE_TARGETS=cleave "$root/scripts/build.sh"
exec "$root/build/apps/cleave" demo "$@"
