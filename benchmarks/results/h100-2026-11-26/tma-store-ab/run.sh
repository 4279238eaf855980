#!/bin/bash
# The generated epilogue of TMA stores on the device: the wgmma sketch's GPU test
# (sampled and fixed states, exact check), then the best states of the 480 s run with
# and without TMA stores beside PyTorch (cuBLAS), alternated twice.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-} TILESCHED_BIN=$D/tilesched TILESCHED_TEST_OUT=/tmp/testout TILESCHED_TEST_DEVICES=0
mkdir -p /tmp/testout
start=$(date +%s)
timeout 240 $D/wgmma-sketch-gpu-tests --ignored --test-threads 1 --nocapture > $OUT/wgmma-sketch-gpu-tests.txt 2>&1; echo "sketch rc $? $(( $(date +%s) - start )) s"
grep -E "test result|panicked" $OUT/wgmma-sketch-gpu-tests.txt | head -5
echo "exact: $(grep -cE ": exact" $OUT/wgmma-sketch-gpu-tests.txt) tma_store: $(grep -E ": exact" $OUT/wgmma-sketch-gpu-tests.txt | grep -c tma_store)"
grep -iE "mismatch|wrong|error" $OUT/wgmma-sketch-gpu-tests.txt | head -5
for pass in 1 2; do for v in off on; do
  python3 benchmarks/peer/torch_peer.py --export ab-store/$v/*.cubin.json --out $OUT/peer-$v-$pass --no-compile --rounds 3 --min-time-ms 60 > $OUT/peer-$v-$pass.log 2>&1
  echo "== $v pass $pass"; grep -E "^\| .matmul" $OUT/peer-$v-$pass/peer.md | cut -d'|' -f2,4,5,7,9,10,12,14
done; done
