set -u
# The runtime launching deploy-cache kernels of the wgmma conv sketch (im2col maps,
# workspaces) against the reference: caches from the batch-1 and batch-8 fp16 logs.
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
caches=""
for b in 1 8; do
  L=benchmarks/results/h100-2026-11-26/resnet-fp16-b$b-hopper-*/tune-log.jsonl.gz
  $D/tilesched deploy add --log $L --cache /tmp/cache-b$b >> $OUT/deploy-add.txt 2>&1
  caches="$caches${caches:+:}/tmp/cache-b$b"
done
grep -h -o '"sketch":"[a-z_.]*"' /tmp/cache-b*/*.json 2>/dev/null | sort | uniq -c
TILESCHED_RUNTIME_CACHES="$caches" TILESCHED_TEST_OUT=$OUT timeout 300 $D/gpu-tests --ignored --test-threads 1 --nocapture runtime_launches > $OUT/runtime-test.txt 2>&1
echo "runtime test exit $?"; tail -25 $OUT/runtime-test.txt | cut -c1-300
cp target/device-pack/rt.sh $OUT/
