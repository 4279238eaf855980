set -u
# `bench --peer torch` end to end with the peer built into this binary (13208e1): resnet fp16
# batch 1, the day's two batch-1 logs merged; the peer without torch.compile.
. target/device-pack/common0.sh
R=benchmarks/results/h100-2026-11-27
for d in rowspan streamk; do zcat $R/resnet-fp16-b1-$d/tune-log.jsonl.gz; done > /tmp/b1.jsonl
N=bench-peer-torch-b1
mkdir -p $OUT/$N; start=$(date +%s)
timeout 300 $B bench conv2d --network resnet --batch 1 --dtype fp16 --out-dtype fp16 --layout nhwc --log /tmp/b1.jsonl --out $OUT/$N --peer torch --peer-arg=--no-compile > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench --peer torch exit $?, wall $(( $(date +%s) - start )) s"
grep Geometric $OUT/$N/bench.md | cut -c1-80; grep -E "geomean|first pick" $OUT/$N/peer/peer.md; grep -iE "geomean|geometric" $OUT/$N/strongest.md | head -3
rm -f $OUT/$N/*.png; rm -rf $OUT/$N/peer-kernels
cp target/device-pack/peerbench.sh $OUT/$N/job.sh
cd $OUT && tar -czf pb.tgz * && find . -mindepth 1 -not -name pb.tgz -exec rm -rf {} +
