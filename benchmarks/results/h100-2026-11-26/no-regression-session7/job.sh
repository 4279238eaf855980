set -u
# Issue 30 no-regression after the cluster generalization: the committed fp16 GEMM set
# (1190 s log) and resnet fp16 batch 1 (330 s log) benched again with this build.
. target/device-pack/common0.sh
R=benchmarks/results/h100-2026-11-26
S="--shape 4096,4096,4096 --shape 8192,8192,8192 --shape 2048,4096,4096 --shape 2048,14336,4096 --shape 2048,4096,14336 --shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555"
mkdir -p $OUT/matmul-fp16 $OUT/resnet-fp16-b1
timeout 250 $B bench matmul $S --dtype fp16 --out-dtype fp16 --log $R/matmul-fp16-final-3part-1190s/tune-log.jsonl.gz --out $OUT/matmul-fp16 > $OUT/matmul-fp16/bench-stdout.txt 2>&1
echo "matmul bench exit $?"; grep -E "^\| matmul|Geometric|\*\*total" $OUT/matmul-fp16/bench.md | cut -d'|' -f2,5-8 | cut -c1-120
timeout 150 $B bench conv2d --network resnet --batch 1 --dtype fp16 --out-dtype fp16 --layout nhwc --log $R/resnet-fp16-b1-hopper-330s/tune-log.jsonl.gz --out $OUT/resnet-fp16-b1 > $OUT/resnet-fp16-b1/bench-stdout.txt 2>&1
echo "resnet bench exit $?"; grep -E "Geometric|\*\*total" $OUT/resnet-fp16-b1/bench.md | cut -c1-200
cp target/device-pack/noreg2.sh $OUT/job.sh
cd $OUT && tar -czf noreg2.tgz * && find . -mindepth 1 -not -name noreg2.tgz -exec rm -rf {} +
