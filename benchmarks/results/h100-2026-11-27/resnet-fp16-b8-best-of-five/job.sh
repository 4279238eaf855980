set -u
# Issue 27's agreement line on resnet fp16 batch 8, with the peer's eager at its strongest:
# cudnn.benchmark times every cuDNN configuration and picks afresh on 4 threads (the fastest
# pick kept; the first reported too). The merged batch-8 log of agree.sh benched, then the
# peer with torch.compile, then twice more without it, each in its own process.
. target/device-pack/common0.sh
R=benchmarks/results/h100-2026-11-27
for d in rowspan rowspan-first rowspan-one-ring rowspan-persistent streamk; do zcat $R/resnet-fp16-b8-$d/tune-log.jsonl.gz; done > /tmp/b8.jsonl
N=resnet-fp16-b8-best-of-five
mkdir -p $OUT/$N
timeout 140 $B bench conv2d --network resnet --batch 8 --dtype fp16 --out-dtype fp16 --layout nhwc --log /tmp/b8.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?: $(grep Geometric $OUT/$N/bench.md | cut -c1-60)"
$B deploy add --log /tmp/b8.jsonl --cache /tmp/deploy-8 > $OUT/$N/deploy.txt 2>&1; echo "deploy exit $?"
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" > $OUT/torch.txt
P=$OUT/peer-resnet-fp16-b8; mkdir -p $P; start=$(date +%s)
timeout 330 python3 benchmarks/peer/torch_peer.py --deploy /tmp/deploy-8 --out $P --compile-timeout 40 --min-time-ms 50 --rounds 2 > $P/peer-stdout.txt 2>&1
echo "peer exit $?, wall $(( $(date +%s) - start )) s"; grep -E "geomean|first pick alone" $P/peer.md
for i in 2 3; do
  P=$OUT/peer-resnet-fp16-b8-repeat$i; mkdir -p $P
  timeout 90 python3 benchmarks/peer/torch_peer.py --deploy /tmp/deploy-8 --out $P --no-compile --min-time-ms 50 --rounds 2 > $P/peer-stdout.txt 2>&1
  echo "peer repeat $i exit $?: $(grep -E 'geomean speedup, cold|first pick alone' $P/peer.md | tr '\n' ' ')"
done
cp target/device-pack/final.sh $OUT/$N/job.sh
cd $OUT && tar -czf final.tgz * && find . -mindepth 1 -not -name final.tgz -exec rm -rf {} +
