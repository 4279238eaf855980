set -u
# Issue 27's agreement line on resnet fp16 batch 8: the best kernels of this build's five
# batch-8 tunes of 2026-11-27 (their logs merged), benched; then the PyTorch peer on the same
# kernels, eager's cudnn.benchmark timing every cuDNN configuration (benchmark_limit 0), and
# again with PyTorch's default limit (10, no torch.compile); then which kernels eager runs.
. target/device-pack/common0.sh
R=benchmarks/results/h100-2026-11-27
for d in rowspan rowspan-first rowspan-one-ring rowspan-persistent streamk; do zcat $R/resnet-fp16-b8-$d/tune-log.jsonl.gz; done > /tmp/b8.jsonl
echo "merged log: $(wc -l < /tmp/b8.jsonl) records"
N=resnet-fp16-b8-merged
mkdir -p $OUT/$N
start=$(date +%s)
timeout ${BENCH_LIMIT:-140} $B bench conv2d --network resnet --batch 8 --dtype fp16 --out-dtype fp16 --layout nhwc --log /tmp/b8.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?, wall $(( $(date +%s) - start )) s"; grep -E "Geometric|\*\*total" $OUT/$N/bench.md | cut -c1-200
$B deploy add --log /tmp/b8.jsonl --cache /tmp/deploy-8 > $OUT/$N/deploy.txt 2>&1; echo "deploy exit $?"
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" | tee $OUT/torch.txt
for limit in 0 10; do
  P=peer-resnet-fp16-b8; extra=""
  [ $limit = 0 ] || { P=$P-limit$limit; extra=--no-compile; }
  mkdir -p $OUT/$P; start=$(date +%s)
  timeout ${TT:-300} python3 benchmarks/peer/torch_peer.py --deploy /tmp/deploy-8 --out $OUT/$P --compile-timeout 40 --min-time-ms 50 --rounds 2 --cudnn-benchmark-limit $limit $extra > $OUT/$P/peer-stdout.txt 2>&1
  echo "peer (limit $limit) exit $?, wall $(( $(date +%s) - start )) s"; grep -E "geomean" $OUT/$P/peer.md
done
for limit in 0 10; do timeout 60 python3 target/device-pack/eager_kernels.py $limit 8 > $OUT/eager-kernels-limit$limit.txt 2>&1; done
cut -c1-220 $OUT/eager-kernels-limit0.txt | head -13
cp target/device-pack/agree.sh $OUT/$N/job.sh
cd $OUT && tar -czf agree.tgz * && find . -mindepth 1 -not -name agree.tgz -exec rm -rf {} +
