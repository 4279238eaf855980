set -u
# Issue 30: resnet fp16 NHWC batch BATCH tuned BUDGET s on an empty log with every
# sketch (wgmma stream-K now among them), then benched; optional GPU
# tests first (TESTS=seconds).
. target/device-pack/common0.sh
if [ -n "${TESTS:-}" ]; then
  timeout ${TESTS} $D/wgmma-sketch-gpu-tests --ignored --test-threads 1 --nocapture > $OUT/wgmma-sketch-gpu-tests.txt 2>&1
  echo "gpu tests exit $?"; grep -E "test result|panicked" -A1 $OUT/wgmma-sketch-gpu-tests.txt | cut -c1-400 | head; echo "exact: $(grep -c ': exact' $OUT/wgmma-sketch-gpu-tests.txt)"; grep -E '"cluster_m"' $OUT/wgmma-sketch-gpu-tests.txt | grep -c exact
fi
N=${NAME:-resnet-fp16-b${BATCH}-hopper}
mkdir -p $OUT/$N
rm -f /tmp/r.jsonl
start=$(date +%s)
$B tune conv2d --network ${NET:-resnet} --batch $BATCH --dtype ${DT:-fp16} --out-dtype ${DT:-fp16} --layout nhwc --time-budget ${BUDGET} --objective geomean --trials 40000 --log /tmp/r.jsonl > $OUT/$N/tune.txt 2> $OUT/$N/tune-stderr.txt
echo "tune exit $?, wall $(( $(date +%s) - start )) s"; tail -4 $OUT/$N/tune.txt | cut -c1-200
timeout ${BENCH_LIMIT:-110} $B bench conv2d --network ${NET:-resnet} --batch $BATCH --dtype ${DT:-fp16} --out-dtype ${DT:-fp16} --layout nhwc --log /tmp/r.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?"; grep -E "^\| conv|Geometric" $OUT/$N/bench.md | cut -d'|' -f2,5-8,14 | cut -c1-150 | head -30
python3 benchmarks/scripts/trim_log.py /tmp/r.jsonl $OUT/$N/tune-log.jsonl.gz > /dev/null
cp /tmp/r.jsonl $OUT/full-log.jsonl 2>/dev/null; gzip -f $OUT/full-log.jsonl
cp target/device-pack/tb.sh $OUT/$N/job.sh
cd $OUT && tar -czf tb.tgz --exclude=full-log.jsonl.gz * && find . -mindepth 1 -not -name tb.tgz -not -name full-log.jsonl.gz -exec rm -rf {} +
