set -u
# Call 1: exact checks of split states (wgmma sketch, mma.sync states) on the new build,
# then the split A/B: the previous build (ordered fixup) against this one (sums in L2),
# per (sketch, split) the previous tune's best state of each small shape, benched
# alternately by both builds.
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export TILESCHED_BIN=$D/tilesched LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-} TILESCHED_FONT=$D/fonts/DejaVuSans.ttf TILESCHED_TEST_OUT=/tmp/testout TILESCHED_TEST_DEVICES=0
mkdir -p /tmp/testout $OUT/ab
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
start=$(date +%s)
timeout 200 $D/wgmma-sketch-gpu-tests --ignored --test-threads 1 --nocapture > $OUT/wgmma-sketch-gpu-tests.txt 2>&1
echo "wgmma sketch: $(grep 'test result' $OUT/wgmma-sketch-gpu-tests.txt) $(( $(date +%s) - start )) s"
start=$(date +%s)
timeout 200 $D/gpu-tests --ignored --test-threads 1 --nocapture tensor_core_states > $OUT/gpu-tests-tensor-core.txt 2>&1
echo "tensor-core states: $(grep 'test result' $OUT/gpu-tests-tensor-core.txt) $(( $(date +%s) - start )) s"
grep -c '"split_k"' /tmp/testout/*.jsonl 2>/dev/null | tail -3
for pass in 1 2; do
  while read name shapes; do
    for b in before after; do
      bin=$D/tilesched; [ $b = before ] && bin=$D/tilesched-before
      timeout 60 $bin bench matmul $shapes --dtype fp16 --out-dtype fp16 --log target/device-pack/splitab/$name.jsonl --out /tmp/ab-$name-$b-$pass --rounds 2 --min-time-ms 20 --algorithms 4 > $OUT/ab/$name-$b-$pass.txt 2>&1
      grep "ours" $OUT/ab/$name-$b-$pass.txt | sed "s/^/$name $b $pass: /" | cut -c1-150
    done
  done < target/device-pack/splitab/list.txt
done
tar -C $OUT -czf /tmp/call1.tgz . && rm -rf $OUT/* && mv /tmp/call1.tgz $OUT/
