set -u
# Issue 30: the wgmma conv states exact on the GPU (the fixed walk), then resnet fp16
# NHWC at batch BATCH tuned BUDGET s with every sketch on an empty log, benched.
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-} TILESCHED_FONT=$D/fonts/DejaVuSans.ttf
B=$D/tilesched
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if [ -n "${TESTS:-}" ]; then
  TILESCHED_SKETCH_TASKS=conv2d timeout ${TESTS} $D/wgmma-sketch-gpu-tests --ignored --test-threads 1 --nocapture > $OUT/wgmma-conv-gpu-tests.txt 2>&1
  echo "gpu tests exit $?"; grep -E "test result|panicked" -A1 $OUT/wgmma-conv-gpu-tests.txt | cut -c1-400 | head; echo "exact: $(grep -c ': exact' $OUT/wgmma-conv-gpu-tests.txt)"
fi
N=resnet-fp16-b${BATCH}-hopper
mkdir -p $OUT/$N
rm -f /tmp/r.jsonl
start=$(date +%s)
$B tune conv2d --network resnet --batch $BATCH --dtype fp16 --out-dtype fp16 --layout nhwc --time-budget ${BUDGET} --objective geomean --trials 40000 --log /tmp/r.jsonl > $OUT/$N/tune.txt 2> $OUT/$N/tune-stderr.txt
echo "tune exit $?, wall $(( $(date +%s) - start )) s"; tail -3 $OUT/$N/tune.txt
timeout 100 $B bench conv2d --network resnet --batch $BATCH --dtype fp16 --out-dtype fp16 --layout nhwc --log /tmp/r.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?"; grep -E "^\| conv|Geometric" $OUT/$N/bench.md | cut -d'|' -f2,5-8,13 | head -16
python3 benchmarks/scripts/trim_log.py /tmp/r.jsonl $OUT/$N/tune-log.jsonl.gz > /dev/null
cp target/device-pack/conv2.sh $OUT/$N/job.sh
cd $OUT && tar -czf conv.tgz * && find . -mindepth 1 -not -name conv.tgz -exec rm -rf {} +
