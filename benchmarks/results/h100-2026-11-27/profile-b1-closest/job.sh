set -u
# Issue 30: why batch 1 stays near 1.2x: for three of its closest layers, the tuned best
# kernel (from the 300 s log) and the vendor's first graph engine, each timed by bench
# and profiled by Nsight Compute (duration against bench's per-launch time).
. target/device-pack/common0.sh
P=target/device-pack/prof3
T="--dtype fp16 --out-dtype fp16 --layout nhwc"
mkdir -p $OUT/prof3
for n in l14-1x1:1,256,14,14,1024,1,1,1,0 l14-3x3:1,256,14,14,256,3,3,1,1 l28-1x1:1,128,28,28,512,1,1,1,0; do
  name=${n%%:*}; S=${n#*:}
  timeout 60 $B bench conv2d --shape $S $T --log $P/$name.jsonl --out /tmp/b-$name --engines 1 --handles 0 --conv-gemm-algorithms 0 > $OUT/prof3/$name-bench.txt 2>&1
  echo "$name: $(grep -E 'Geometric' /tmp/b-$name/bench.md | cut -c1-60) $(grep -E '^\| conv' /tmp/b-$name/bench.md | cut -d'|' -f5-7,14 | cut -c1-120)"
  cp /tmp/b-$name/bench.md $OUT/prof3/$name-bench.md
  for side in ours:"regex:^conv2d_" vendor:"regex:sm90|sm80|xmma|cutlass|nvjet|implicit|gemm"; do
    who=${side%%:*}; re=${side#*:}
    timeout 100 ncu --clock-control none --launch-skip 3 --launch-count 1 --kernel-name "$re" --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
      -o $OUT/prof3/$name-$who -f $B bench conv2d --shape $S $T --log $P/$name.jsonl --out /tmp/pb-$name --rounds 1 --min-time-ms 1 --min-repeats 4 --engines 1 --handles 0 --conv-gemm-algorithms 0 > $OUT/prof3/$name-$who-ncu-run.txt 2>&1
    ncu -i $OUT/prof3/$name-$who.ncu-rep --page details --print-details all > $OUT/prof3/$name-$who-details.txt 2>&1
    grep -E "^  [a-zA-Z_0-9]+.*\(|^\s+(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Grid Size|Achieved Occupancy)" $OUT/prof3/$name-$who-details.txt | head -10 | sed "s/^/$name $who /" | cut -c1-170
  done
done
rm -f $OUT/prof3/*.ncu-rep
cd $OUT && tar -czf prof3.tgz * && find . -mindepth 1 -not -name prof3.tgz -exec rm -rf {} +
