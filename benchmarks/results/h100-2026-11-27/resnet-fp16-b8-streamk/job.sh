set -u
# Issue 30, stream-K in the mma.sync sketch: its GPU test (exact, timed), then resnet
# (NET) DT batch BATCH tuned BUDGET s on an empty log with every sketch, then benched.
. target/device-pack/common0.sh
if [ "${TESTS:-0}" != 0 ]; then
timeout ${TESTS} $D/mma-stream-k-gpu-tests --ignored --test-threads 1 --nocapture > $OUT/mma-stream-k-gpu-tests.txt 2>&1
echo "stream-K tests exit $?"; grep -E "test result|panicked" -A2 $OUT/mma-stream-k-gpu-tests.txt | cut -c1-400 | head; echo "exact: $(grep -c ': exact' $OUT/mma-stream-k-gpu-tests.txt)"
fi
[ -n "${BUDGET:-}" ] || exit 0
N=${NAME:-resnet-fp16-b${BATCH}-streamk}
mkdir -p $OUT/$N
rm -f /tmp/r.jsonl
start=$(date +%s)
$B tune conv2d --network ${NET:-resnet} --batch $BATCH --dtype ${DT:-fp16} --out-dtype ${DT:-fp16} --layout nhwc --time-budget ${BUDGET} --objective geomean --trials 40000 --log /tmp/r.jsonl > $OUT/$N/tune.txt 2> $OUT/$N/tune-stderr.txt
echo "tune exit $?, wall $(( $(date +%s) - start )) s"; tail -4 $OUT/$N/tune.txt | cut -c1-200
timeout ${BENCH_LIMIT:-110} $B bench conv2d --network ${NET:-resnet} --batch $BATCH --dtype ${DT:-fp16} --out-dtype ${DT:-fp16} --layout nhwc --log /tmp/r.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?"; grep -E "^\| conv|Geometric" $OUT/$N/bench.md | cut -d'|' -f2,5-8,14 | cut -c1-150 | head -30
python3 benchmarks/scripts/trim_log.py /tmp/r.jsonl $OUT/$N/tune-log.jsonl.gz > /dev/null
cp /tmp/r.jsonl $OUT/full-log.jsonl 2>/dev/null; gzip -f $OUT/full-log.jsonl
cp target/device-pack/sk.sh $OUT/$N/job.sh
cd $OUT && tar -czf sk.tgz --exclude=full-log.jsonl.gz * && find . -mindepth 1 -not -name sk.tgz -not -name full-log.jsonl.gz -exec rm -rf {} +
