#!/usr/bin/env bash
# canonical_unroll A/B: the build before it (ad775d1) and this one, one H200, 1536 resnet
# f32 trials, fresh caches, three seeds alternating.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
nproc >> $OUT/device.txt
SEEDS="0 1 2" scripts/device-check scale 1536 before > $OUT/console.txt 2>&1
ls $OUT
