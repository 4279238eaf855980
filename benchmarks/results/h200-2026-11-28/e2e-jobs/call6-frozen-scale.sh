#!/usr/bin/env bash
# Call 6 (2 GPUs). First, issue 50's strongest PyTorch baseline: ResNet-50 b1 (GPU 1)
# and b8 (GPU 0) against torch.compile(max-autotune) with Inductor's freezing (BatchNorm
# folded into the convolutions), beside the compiled model with our kernels. Then
# issue 51's queue on both GPUs: Redis killed -9 mid-run and restarted empty, and the
# local pool with --model-lag 1 on one and two GPUs.
set -u
cd "$(dirname "$0")/../../../.."
tar -C target -xJf target/device-pack/device.tar.xz
python3 -m pip install -q --no-deps --target target/device-python target/device-pack/tilesched-*.whl
export PYTHONPATH="$PWD/target/device-python"
(
  CUDA_VISIBLE_DEVICES=0 E2E_TESTS=0 timeout 400 scripts/device-check e2e-run e2e-resnet50-fp16-b8-frozen torchvision:resnet50 8 device-in/deploy-r50-b8 --samples 300 --compile frozen
) > "$OUT/lane0.txt" 2>&1 &
(
  CUDA_VISIBLE_DEVICES=1 E2E_TESTS=0 timeout 400 scripts/device-check e2e-run e2e-resnet50-fp16-b1-frozen torchvision:resnet50 1 device-in/deploy-r50-b1 --samples 300 --compile frozen
) > "$OUT/lane1.txt" 2>&1 &
wait
timeout 170 scripts/device-check scale 1536 restart,lag > "$OUT/scale-stdout.txt" 2>&1
nvidia-smi --query-gpu=index,name,driver_version --format=csv > "$OUT/gpus.txt"
# At most 8 files come back: the small ones in one archive.
(cd "$OUT" && tar -cf logs.tar lane0.txt lane1.txt gpus.txt device.txt scale-stdout.txt && rm -f lane0.txt lane1.txt gpus.txt device.txt scale-stdout.txt)
ls -la "$OUT"
