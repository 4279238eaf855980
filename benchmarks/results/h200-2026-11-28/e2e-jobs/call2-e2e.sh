#!/usr/bin/env bash
# Call 2 of issue 50's end-to-end runs (2 GPUs): the package's GPU tests and e2e.py on the
# deploy caches of call 1. Lane 0: ResNet-50 b1 then ViT-B/16 b8; lane 1: ResNet-50 b8.
set -u
cd "$(dirname "$0")/.."
tar -C target -xJf target/device-pack/device.tar.xz
python3 -m pip install -q --no-deps --target target/device-python target/device-pack/tilesched-*.whl
export PYTHONPATH="$PWD/target/device-python"
(
  CUDA_VISIBLE_DEVICES=0 timeout 330 scripts/device-check e2e-run e2e-resnet50-fp16-b1 torchvision:resnet50 1 device-in/deploy-r50-b1 --samples 200
  CUDA_VISIBLE_DEVICES=0 timeout 250 scripts/device-check e2e-run e2e-vit_b_16-fp16-b8 torchvision:vit_b_16 8 device-in/deploy-vit-b8 --samples 200
) > "$OUT/lane0.txt" 2>&1 &
(
  CUDA_VISIBLE_DEVICES=1 timeout 560 scripts/device-check e2e-run e2e-resnet50-fp16-b8 torchvision:resnet50 8 device-in/deploy-r50-b8 --samples 200
) > "$OUT/lane1.txt" 2>&1 &
wait
ls -la "$OUT"
