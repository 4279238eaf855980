set -u
# Issue 30: stream-K (98b66ee, 421280f). (1) The wgmma sketch's GPU test on five tasks
# (fixed stream-K states among the states); (2) stream-K states of the small-grid
# layers (b8 7² 3×3, 14² 3×3, 7² 1×1 to 2048; b1 7² 3×3), one state per bench.
. target/device-pack/common0.sh
E=target/device-pack/exp3
T="--dtype fp16 --out-dtype fp16 --layout nhwc"
V="--algorithms 1 --engines 1 --handles 0 --conv-gemm-algorithms 0"
mkdir -p $OUT/x
TILESCHED_SKETCH_TASKS=conv2d_n8_c256_h14,conv2d_n1_c512_h7,matmul_m128_n768,matmul_m200_n136,conv2d_n1_c64_h56_w56_k64_r3 \
  timeout 300 $D/wgmma-sketch-gpu-tests --ignored --test-threads 1 --nocapture > $OUT/x/wgmma-sketch-gpu-tests.txt 2>&1
echo "gpu tests exit $?"; grep -E "test result|panicked" -A1 $OUT/x/wgmma-sketch-gpu-tests.txt | cut -c1-400 | head
echo "exact: $(grep -c ': exact' $OUT/x/wgmma-sketch-gpu-tests.txt)  with stream_k: $(grep '"stream_k"' $OUT/x/wgmma-sketch-gpu-tests.txt | grep -c ': exact')"
for f in $E/*.jsonl; do
  n=$(basename $f .jsonl)
  case $n in l7b8*) S=8,512,7,7,512,3,3,1,1;; l14b8*) S=8,256,14,14,256,3,3,1,1;; l1x1b8*) S=8,512,7,7,2048,1,1,1,0;; l7b1*) S=1,512,7,7,512,3,3,1,1;; esac
  timeout 60 $B bench conv2d --shape $S $T --log $f --out /tmp/b-$n --rounds 2 --min-time-ms 20 $V > $OUT/x/$n-bench.txt 2>&1
  echo "$n: $(grep -E 'ours .*vendor' $OUT/x/$n-bench.txt | cut -d: -f2- | cut -c1-60)"
done
cp target/device-pack/exp3.sh $OUT/job.sh; cp -r $E $OUT/records
cd $OUT && tar -czf exp3.tgz * && find . -mindepth 1 -not -name exp3.tgz -exec rm -rf {} +
