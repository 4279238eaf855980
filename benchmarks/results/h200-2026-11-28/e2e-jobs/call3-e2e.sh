#!/usr/bin/env bash
# Call 3 of issue 50's end-to-end runs (2 GPUs), after the timing protocol gained a
# busy-wait (GPU time) beside wall time and eager a BatchNorm-folded side. Lane 0:
# ResNet-50 b1 (with the package's GPU tests); lane 1: ResNet-50 b8, then ViT-B/16 b8
# (with the tests).
set -u
cd "$(dirname "$0")/.."
tar -C target -xJf target/device-pack/device.tar.xz
python3 -m pip install -q --no-deps --target target/device-python target/device-pack/tilesched-*.whl
export PYTHONPATH="$PWD/target/device-python"
(
  CUDA_VISIBLE_DEVICES=0 timeout 520 scripts/device-check e2e-run e2e-resnet50-fp16-b1 torchvision:resnet50 1 device-in/deploy-r50-b1 --samples 200
) > "$OUT/lane0.txt" 2>&1 &
(
  CUDA_VISIBLE_DEVICES=1 E2E_TESTS=0 timeout 360 scripts/device-check e2e-run e2e-resnet50-fp16-b8 torchvision:resnet50 8 device-in/deploy-r50-b8 --samples 200
  CUDA_VISIBLE_DEVICES=1 timeout 160 scripts/device-check e2e-run e2e-vit_b_16-fp16-b8 torchvision:vit_b_16 8 device-in/deploy-vit-b8 --samples 200
) > "$OUT/lane1.txt" 2>&1 &
wait
for d in "$OUT"/e2e-*/; do [ -d "$d" ] && tar -C "$OUT" -cf "${d%/}.tar" "$(basename "$d")" && rm -rf "$d"; done
ls -la "$OUT"
