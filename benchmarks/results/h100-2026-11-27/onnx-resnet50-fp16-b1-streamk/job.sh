set -u
# Issue 30: ResNet-50 from ONNX (torchvision export, 23 unique convolutions), fp16 NHWC
# at batch BATCH, tuned BUDGET s on an empty log with every sketch, then benched.
. target/device-pack/common0.sh
W=/tmp/onnx; mkdir -p $W
N=onnx-resnet50-fp16-hopper/b${BATCH}
mkdir -p $OUT/$N
python3 benchmarks/onnx/export.py $W --models resnet50 > $OUT/$N/export.txt 2>&1; echo "export exit $?"
IN="--input input=${BATCH},3,224,224"
$B workloads --onnx $W/resnet50.onnx $IN --dtype fp16 --out-dtype fp16 --layout nhwc > $OUT/$N/workloads.txt 2>&1; echo "workloads exit $?"; head -3 $OUT/$N/workloads.txt
rm -f /tmp/o.jsonl
start=$(date +%s)
$B tune conv2d --onnx $W/resnet50.onnx $IN --dtype fp16 --out-dtype fp16 --layout nhwc --time-budget ${BUDGET} --objective geomean --trials 100000 --log /tmp/o.jsonl > $OUT/$N/tune.txt 2> $OUT/$N/tune-stderr.txt
echo "tune exit $?, wall $(( $(date +%s) - start )) s"; tail -4 $OUT/$N/tune.txt | cut -c1-200
timeout ${BENCH_LIMIT:-120} $B bench conv2d --onnx $W/resnet50.onnx $IN --dtype fp16 --out-dtype fp16 --layout nhwc --log /tmp/o.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?"; grep -E "^\| \*\*total|Geometric" $OUT/$N/bench.md | cut -c1-300
python3 benchmarks/scripts/trim_log.py /tmp/o.jsonl $OUT/$N/tune-log.jsonl.gz > /dev/null
cp target/device-pack/onnx.sh $OUT/$N/job.sh
cd $OUT && tar -czf onnx.tgz * && find . -mindepth 1 -not -name onnx.tgz -exec rm -rf {} +
