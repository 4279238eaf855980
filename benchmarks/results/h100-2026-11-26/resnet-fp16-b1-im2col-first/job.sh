set -u
# Issue 30, first GPU check: the wgmma sketch's conv states (im2col) exact on the GPU, then
# a short fp16 batch-1 resnet tune with every sketch, and bench.
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-} TILESCHED_FONT=$D/fonts/DejaVuSans.ttf
B=$D/tilesched
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt

T=wgmma-sketch-gpu-tests
TILESCHED_SKETCH_TASKS=conv2d timeout 220 $D/$T --ignored --test-threads 1 --nocapture > $OUT/wgmma-conv-gpu-tests.txt 2>&1
echo "gpu tests exit $?"; grep -E "test result|panicked" $OUT/wgmma-conv-gpu-tests.txt | head; grep -c ": exact" $OUT/wgmma-conv-gpu-tests.txt
N=resnet-fp16-b1-im2col
mkdir -p $OUT/$N
start=$(date +%s)
$B tune conv2d --network resnet --batch 1 --dtype fp16 --out-dtype fp16 --layout nhwc --time-budget ${BUDGET:-240} --objective geomean --trials 20000 --log /tmp/r1.jsonl > $OUT/$N/tune.txt 2> $OUT/$N/tune-stderr.txt
echo "tune exit $?, wall $(( $(date +%s) - start )) s"; head -16 $OUT/$N/tune.txt
timeout 100 $B bench conv2d --network resnet --batch 1 --dtype fp16 --out-dtype fp16 --layout nhwc --log /tmp/r1.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?"; grep -E "^\| conv|Geometric" $OUT/$N/bench.md | cut -d'|' -f2,5-8,13 | head -16
python3 benchmarks/scripts/trim_log.py /tmp/r1.jsonl $OUT/$N/tune-log.jsonl.gz > /dev/null
cp target/device-pack/conv1.sh $OUT/$N/job.sh
cd $OUT && tar -czf conv1.tgz * && find . -mindepth 1 -not -name conv1.tgz -exec rm -rf {} +
