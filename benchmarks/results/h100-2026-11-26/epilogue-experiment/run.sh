#!/bin/bash
# Experiment: the epilogue of three wgmma kernels, as generated (v0), staged through
# shared memory with 16-byte stores (v1), staged and written by TMA (v2).
set -u
cd exp-epilogue
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
for f in *_v?.cu; do
  b=${f%.cu}
  nvcc -cubin -arch=sm_90a -O3 -Xptxas -v -o $b.cubin $f > $OUT/ptxas-$b.txt 2>&1 || echo "nvcc failed $f"
done
grep -H -E "registers|C7518|spill" $OUT/ptxas-*.txt | cut -c1-200
for v in v0 v1 v2; do
  python3 ../benchmarks/peer/torch_peer.py --export *_$v.cubin.json --out $OUT/peer-$v --no-compile --rounds 3 --min-time-ms 60 > $OUT/peer-$v.log 2>&1
  echo "== $v"; tail -12 $OUT/peer-$v.log
done
for v in v0 v1 v2 v0; do
  python3 ../benchmarks/peer/torch_peer.py --export *_$v.cubin.json --out $OUT/peer2-$v --no-compile --rounds 3 --min-time-ms 60 > $OUT/peer2-$v.log 2>&1
  echo "== again $v"; grep -E "^\|" $OUT/peer2-$v/peer.md | head -8
done
