set -u
# The record at batch 1: resnet fp16 batch 1, the best kernels of this build's two batch-1
# tunes of 2026-11-27 (logs merged), benched, then the PyTorch peer with eager at its
# strongest (every cuDNN configuration, the fastest of 4 fresh picks).
. target/device-pack/common0.sh
R=benchmarks/results/h100-2026-11-27
for d in rowspan streamk; do zcat $R/resnet-fp16-b1-$d/tune-log.jsonl.gz; done > /tmp/b1.jsonl
N=resnet-fp16-b1-best-of-two
mkdir -p $OUT/$N
timeout 140 $B bench conv2d --network resnet --batch 1 --dtype fp16 --out-dtype fp16 --layout nhwc --log /tmp/b1.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?: $(grep Geometric $OUT/$N/bench.md | cut -c1-60)"
$B deploy add --log /tmp/b1.jsonl --cache /tmp/deploy-1 > $OUT/$N/deploy.txt 2>&1; echo "deploy exit $?"
P=$OUT/peer-resnet-fp16-b1; mkdir -p $P; start=$(date +%s)
timeout 330 python3 benchmarks/peer/torch_peer.py --deploy /tmp/deploy-1 --out $P --compile-timeout 40 --min-time-ms 50 --rounds 2 > $P/peer-stdout.txt 2>&1
echo "peer exit $?, wall $(( $(date +%s) - start )) s"; grep -E "geomean|first pick alone" $P/peer.md
cp target/device-pack/b1.sh $OUT/$N/job.sh
cd $OUT && tar -czf b1.tgz * && find . -mindepth 1 -not -name b1.tgz -exec rm -rf {} +
