set -u
# Issue 27's agreement line, repeated: PyTorch's cudnn.benchmark picks its engines afresh in
# every process (warm L2, median of three samples per candidate), so eager's time varies
# between runs. The merged batch-8 log of agree.sh, benched twice more, and the PyTorch peer
# (no torch.compile) three more times with benchmark_limit 0 and twice with PyTorch's default
# 10, each in its own process, interleaved.
. target/device-pack/common0.sh
R=benchmarks/results/h100-2026-11-27
for d in rowspan rowspan-first rowspan-one-ring rowspan-persistent streamk; do zcat $R/resnet-fp16-b8-$d/tune-log.jsonl.gz; done > /tmp/b8.jsonl
$B deploy add --log /tmp/b8.jsonl --cache /tmp/deploy-8 > /dev/null 2>&1; echo "deploy exit $?"
bench() {
  mkdir -p $OUT/bench-$1
  timeout 140 $B bench conv2d --network resnet --batch 8 --dtype fp16 --out-dtype fp16 --layout nhwc --log /tmp/b8.jsonl --out $OUT/bench-$1 > $OUT/bench-$1/bench-stdout.txt 2> $OUT/bench-$1/bench-stderr.txt
  echo "bench $1 exit $?: $(grep Geometric $OUT/bench-$1/bench.md | cut -c1-60)"
  rm -f $OUT/bench-$1/*.png
}
peer() {
  P=$OUT/peer-limit$1-$2; mkdir -p $P
  timeout 120 python3 benchmarks/peer/torch_peer.py --deploy /tmp/deploy-8 --out $P --no-compile --min-time-ms 50 --rounds 2 --cudnn-benchmark-limit $1 > $P/peer-stdout.txt 2>&1
  echo "peer limit $1 run $2 exit $?: $(grep 'geomean speedup, cold' $P/peer.md)"
}
bench 2; peer 0 2; peer 10 2; bench 3; peer 0 3; peer 10 3; peer 0 4
cp target/device-pack/repeat.sh $OUT/job.sh
cd $OUT && tar -czf repeat.tgz * && find . -mindepth 1 -not -name repeat.tgz -exec rm -rf {} +
