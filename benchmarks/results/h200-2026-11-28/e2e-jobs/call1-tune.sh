#!/usr/bin/env bash
# Call 1 of issue 50's end-to-end runs (2 GPUs): each model's task list tuned into a
# deploy cache. Lane 0: ResNet-50 b1 then ViT-B/16 b8; lane 1: ResNet-50 b8.
set -u
cd "$(dirname "$0")/.."
tar -C target -xJf target/device-pack/device.tar.xz
python3 -m pip install -q --no-deps --target target/device-python target/device-pack/tilesched-*.whl
export RAYON_NUM_THREADS=16
python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)" > "$OUT/versions.txt" 2>&1
(
  CUDA_VISIBLE_DEVICES=0 scripts/device-check e2e-tune r50-b1 torchvision:resnet50 1 210 20
  CUDA_VISIBLE_DEVICES=0 scripts/device-check e2e-tune vit-b8 torchvision:vit_b_16 8 25 150
) > "$OUT/lane0.txt" 2>&1 &
(
  CUDA_VISIBLE_DEVICES=1 scripts/device-check e2e-tune r50-b8 torchvision:resnet50 8 400 20
) > "$OUT/lane1.txt" 2>&1 &
wait
ls -la "$OUT"
