set -u
# Issue 30: why clustered wgmma convolutions lose: one 64x64 state of the 7x7 b8 layer
# (split 2, atomic sums) unclustered and in clusters of 1x2, 2x1, 2x2, 1x4, 2x4, timed
# by bench; Nsight Compute on the unclustered, 2x2 and 2x1 ones. Then the GPU tests.
. target/device-pack/common0.sh
P=target/device-pack/prof2
T="--dtype fp16 --out-dtype fp16 --layout nhwc"
S=8,512,7,7,512,3,3,1,1
mkdir -p $OUT/prof2
for n in l7-flat l7-pair c-2x1 c-2x2 c-1x4 c-2x4; do
  timeout 60 $B bench conv2d --shape $S $T --log $P/$n.jsonl --out /tmp/b-$n --rounds 2 --min-time-ms 20 --algorithms 1 --engines 1 --handles 0 --conv-gemm-algorithms 0 > $OUT/prof2/$n-bench.txt 2>&1
  echo "$n: $(grep -E 'ours .*vendor' $OUT/prof2/$n-bench.txt)"
done
for n in l7-flat c-2x2 c-2x1; do
  timeout 120 ncu --clock-control none --kernel-name "regex:^conv2d_" --launch-skip 2 --launch-count 1 --set full --import-source no -o $OUT/prof2/$n -f \
    $B bench conv2d --shape $S $T --log $P/$n.jsonl --out /tmp/pb-$n --rounds 1 --min-time-ms 1 --min-repeats 3 --algorithms 1 --engines 1 --handles 0 --conv-gemm-algorithms 0 > $OUT/prof2/$n-ncu-run.txt 2>&1
  ncu -i $OUT/prof2/$n.ncu-rep --page details --print-details all > $OUT/prof2/$n-details.txt 2>&1
  ncu -i $OUT/prof2/$n.ncu-rep --page source --csv --print-source sass > $OUT/prof2/$n-source.csv 2>/dev/null
  grep -E "^\s+(Duration|Elapsed Cycles|L2 Cache Throughput|Cluster|Max Cluster|Grid Size)" $OUT/prof2/$n-details.txt | head -8 | sed "s/^/$n /"
done
rm -f $OUT/prof2/*.ncu-rep
if [ -n "${TESTS:-}" ]; then
  timeout ${TESTS} $D/wgmma-sketch-gpu-tests --ignored --test-threads 1 --nocapture > $OUT/wgmma-sketch-gpu-tests.txt 2>&1
  echo "gpu tests exit $?"; grep -E "test result|panicked" -A1 $OUT/wgmma-sketch-gpu-tests.txt | cut -c1-400 | head; echo "exact: $(grep -c ': exact' $OUT/wgmma-sketch-gpu-tests.txt)"; echo "exact with cluster_m: $(grep '"cluster_m"' $OUT/wgmma-sketch-gpu-tests.txt | grep -c ': exact')"
fi
cd $OUT && tar -czf prof2.tgz * && find . -mindepth 1 -not -name prof2.tgz -exec rm -rf {} +
