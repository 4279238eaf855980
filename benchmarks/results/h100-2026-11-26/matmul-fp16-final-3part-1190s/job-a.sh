set -u
# Call 4: mma.sync pipeline depth A/B (each small shape's best mma.sync state at 4, 5,
# 6 and 8 stages, two passes), then part A of a fresh tune of the fp16 set.
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-} TILESCHED_FONT=$D/fonts/DejaVuSans.ttf
B=$D/tilesched
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
export TILESCHED_BIN=$B TILESCHED_TEST_OUT=/tmp/testout TILESCHED_TEST_DEVICES=0
mkdir -p /tmp/testout $OUT/stages
timeout 100 $D/gpu-tests --ignored --test-threads 1 --nocapture tensor_core_states > $OUT/gpu-tests-tensor-core.txt 2>&1
echo "tensor-core states: $(grep 'test result' $OUT/gpu-tests-tensor-core.txt)"
grep -h -o '"stages":[5-8]' /tmp/testout/*.jsonl 2>/dev/null | sort | uniq -c
for pass in 1 2; do
  while read name shapes; do
    timeout 60 $B bench matmul $shapes --dtype fp16 --out-dtype fp16 --log target/device-pack/stab/$name.jsonl --out /tmp/st-$name-$pass --rounds 2 --min-time-ms 20 --algorithms 4 > $OUT/stages/$name-$pass.txt 2>&1
    grep "ours" $OUT/stages/$name-$pass.txt | grep -v "^|" | sed "s/(.*//; s/^/$name $pass: /"
  done < target/device-pack/stab/list.txt
done
S="--shape 4096,4096,4096 --shape 8192,8192,8192 --shape 2048,4096,4096 --shape 2048,14336,4096 --shape 2048,4096,14336 --shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555"
N=matmul-fp16-final
mkdir -p $OUT/$N
rm -f /tmp/mm.jsonl
start=$(date +%s)
$B tune matmul $S --dtype fp16 --out-dtype fp16 --time-budget ${BUDGET_A:-480} --objective geomean --trials 12000 --log /tmp/mm.jsonl > $OUT/$N/tune-a.txt 2> $OUT/$N/tune-a-stderr.txt
echo "tune A exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune-a.txt
head -12 $OUT/$N/tune-a.txt
cd $OUT && tar -czf call4.tgz * && find . -mindepth 1 -not -name call4.tgz -exec rm -rf {} +
