#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains LeNet-5 on Fashion-MNIST.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
work=$(mktemp -d /tmp/cleave-demo.XXXXXX)
exec "$root/build/apps/cleave" train --model lenet5 --data fashion-mnist --epochs 2 --backend auto \
  --checkpoint "$work/lenet5.ckpt" "$@"
