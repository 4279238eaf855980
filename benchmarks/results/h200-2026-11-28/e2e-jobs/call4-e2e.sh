#!/usr/bin/env bash
# Call 4 of issue 50's end-to-end runs (2 GPUs), after call 3's crash: e2e.py now runs
# and waits for each side on its own, so a GPU fault names its side. Lane 0: every
# kernel of the ResNet-50 caches under compute-sanitizer's memcheck (one allocation per
# tensor), then ResNet-50 b8 end to end. Lane 1: ResNet-50 b1 end to end, then the ViT
# cache under memcheck.
set -u
cd "$(dirname "$0")/../../../.."
tar -C target -xJf target/device-pack/device.tar.xz
python3 -m pip install -q --no-deps --target target/device-python target/device-pack/tilesched-*.whl
export PYTHONPATH="$PWD/target/device-python"
(
  CUDA_VISIBLE_DEVICES=0 MEMCHECK_LIMIT=100 scripts/device-check memcheck device-in/deploy-r50-b1 device-in/deploy-r50-b8
  CUDA_VISIBLE_DEVICES=0 E2E_TESTS=0 timeout 370 scripts/device-check e2e-run e2e-resnet50-fp16-b8 torchvision:resnet50 8 device-in/deploy-r50-b8 --samples 200
) > "$OUT/lane0.txt" 2>&1 &
(
  CUDA_VISIBLE_DEVICES=1 E2E_TESTS=0 timeout 420 scripts/device-check e2e-run e2e-resnet50-fp16-b1 torchvision:resnet50 1 device-in/deploy-r50-b1 --samples 200
  CUDA_VISIBLE_DEVICES=1 MEMCHECK_LIMIT=100 scripts/device-check memcheck device-in/deploy-vit-b8
) > "$OUT/lane1.txt" 2>&1 &
wait
nvidia-smi --query-gpu=index,name,driver_version --format=csv > "$OUT/gpus.txt"
tar -C "$OUT" -cf "$OUT/memcheck.tar" $(cd "$OUT" && ls memcheck-*.txt) && rm -f "$OUT"/memcheck-*.txt
ls -la "$OUT"
