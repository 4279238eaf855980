set -u
# Call 2: exact checks of sampled split states (ordered and atomic sums) on this build,
# then the three small shapes tuned BUDGET_C s more on the final log of the last
# session (836 s of tuning for the set), resumed; the log stays in /tmp for call 3.
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export TILESCHED_BIN=$D/tilesched LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-} TILESCHED_FONT=$D/fonts/DejaVuSans.ttf TILESCHED_TEST_OUT=/tmp/testout TILESCHED_TEST_DEVICES=0
mkdir -p /tmp/testout
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
start=$(date +%s)
timeout 150 $D/wgmma-sketch-gpu-tests --ignored --test-threads 1 --nocapture > $OUT/wgmma-sketch-gpu-tests.txt 2>&1
echo "wgmma sketch: $(grep 'test result' $OUT/wgmma-sketch-gpu-tests.txt) $(( $(date +%s) - start )) s"
grep -c '"split_sums":"atomic"' $OUT/wgmma-sketch-gpu-tests.txt
start=$(date +%s)
timeout 100 $D/gpu-tests --ignored --test-threads 1 --nocapture tensor_core_states > $OUT/gpu-tests-tensor-core.txt 2>&1
echo "tensor-core states: $(grep 'test result' $OUT/gpu-tests-tensor-core.txt) $(( $(date +%s) - start )) s"
grep -h -o '"split_sums":"atomic"' /tmp/testout/*.jsonl 2>/dev/null | wc -l
gunzip -c target/device-pack/matmul-fp16-final-2part-log.jsonl.gz > /tmp/mm.jsonl
SMALL="--shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555"
N=matmul-fp16-split-sums
mkdir -p $OUT/$N
start=$(date +%s)
$D/tilesched tune matmul $SMALL --dtype fp16 --out-dtype fp16 --time-budget ${BUDGET_C:-330} --objective geomean --trials 12000 --resume --log /tmp/mm.jsonl > $OUT/$N/tune-c.txt 2> $OUT/$N/tune-c-stderr.txt
echo "tune C exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune-c.txt
head -8 $OUT/$N/tune-c.txt
cd $OUT && tar -czf call2.tgz * && find . -mindepth 1 -not -name call2.tgz -exec rm -rf {} +
