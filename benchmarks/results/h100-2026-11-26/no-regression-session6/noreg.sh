set -u
# No regression: the committed f32 resnet and fp16 batch-1 logs re-benched by this build.
. target/device-pack/common.sh
R=benchmarks/results
gunzip -c $R/h100-2026-11-22/resnet-geomean/tune-log.jsonl.gz > /tmp/f32.jsonl
gunzip -c $R/h100-2026-11-25/resnet-fp16-b1-tune/best-records.jsonl.gz > /tmp/b1.jsonl
mkdir -p $OUT/no-regression
timeout 200 $B bench conv2d --network resnet --log /tmp/f32.jsonl --out $OUT/no-regression/resnet-f32-rebench > $OUT/no-regression/f32-bench.txt 2>&1
echo "f32 exit $?"; grep -E "Geometric|total" $OUT/no-regression/resnet-f32-rebench/bench.md | head -3
timeout 200 $B bench conv2d --network resnet --batch 1 --dtype fp16 --out-dtype fp16 --layout nhwc --log /tmp/b1.jsonl --out $OUT/no-regression/resnet-fp16-b1-rebench > $OUT/no-regression/b1-bench.txt 2>&1
echo "b1 exit $?"; grep -E "Geometric|total" $OUT/no-regression/resnet-fp16-b1-rebench/bench.md | head -3
cp target/device-pack/noreg.sh $OUT/no-regression/
