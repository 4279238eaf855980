set -u
# Issue 30: (1) clusters whose grid fits the GPU's co-resident clusters, unsplit, on the
# two b8 layers that lose (7² and 14² 3×3), one state each, timed by bench; (2) A/B of
# prefetch.tensormap (f6db208) against the previous build (318dd0d) on the b1 470 s log.
. target/device-pack/common0.sh
E=target/device-pack/exp1
T="--dtype fp16 --out-dtype fp16 --layout nhwc"
V="--algorithms 1 --engines 1 --handles 0 --conv-gemm-algorithms 0"
mkdir -p $OUT/clusters $OUT/prefetch /tmp/old
for f in $E/*.jsonl; do
  n=$(basename $f .jsonl)
  case $n in l7*) S=8,512,7,7,512,3,3,1,1;; *) S=8,256,14,14,256,3,3,1,1;; esac
  timeout 60 $B bench conv2d --shape $S $T --log $f --out /tmp/b-$n --rounds 2 --min-time-ms 20 $V > $OUT/clusters/$n-bench.txt 2>&1
  echo "$n: $(grep -E 'ours .*vendor' $OUT/clusters/$n-bench.txt | cut -d: -f2-)"
done
tar -C /tmp/old -xJf target/device-pack/device-old.tar.xz
