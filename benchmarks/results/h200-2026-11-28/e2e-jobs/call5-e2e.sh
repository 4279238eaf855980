#!/usr/bin/env bash
# Call 5 of issue 50's end-to-end runs (2 GPUs), after call 4 found call 3's fault: the
# eager+fold side's module was freed after its CUDA graph's capture (now kept by the
# replay). Lane 0: ResNet-50 b8; lane 1: ResNet-50 b1; every configuration.
set -u
cd "$(dirname "$0")/../../../.."
tar -C target -xJf target/device-pack/device.tar.xz
python3 -m pip install -q --no-deps --target target/device-python target/device-pack/tilesched-*.whl
export PYTHONPATH="$PWD/target/device-python"
(
  CUDA_VISIBLE_DEVICES=0 E2E_TESTS=0 timeout 520 scripts/device-check e2e-run e2e-resnet50-fp16-b8 torchvision:resnet50 8 device-in/deploy-r50-b8 --samples 300
) > "$OUT/lane0.txt" 2>&1 &
(
  CUDA_VISIBLE_DEVICES=1 E2E_TESTS=0 timeout 520 scripts/device-check e2e-run e2e-resnet50-fp16-b1 torchvision:resnet50 1 device-in/deploy-r50-b1 --samples 300
) > "$OUT/lane1.txt" 2>&1 &
wait
nvidia-smi --query-gpu=index,name,driver_version --format=csv > "$OUT/gpus.txt"
ls -la "$OUT"
