# Issue 51: glibc keeping freed memory (this build, src/malloc.rs) against the build
# before it, alternating, each run 1536 resnet f32 trials with tune's defaults, fresh
# caches (the cubin cache and the driver's). One H200 host of 16 cores.
set -u
tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export TILESCHED_BIN=$D/tilesched LD_LIBRARY_PATH=$D/lib CUDA_CACHE_DISABLE=1
R=/tmp/builds; rm -rf $R; mkdir -p $R
run() { # NAME BINARY tune-flags...
  local n=$1 b=$2; shift 2
  rm -rf /tmp/$n.jsonl /tmp/cubins-$n
  timeout 150 $b tune conv2d --network resnet --trials 1536 --log /tmp/$n.jsonl --cubin-cache /tmp/cubins-$n "$@" > $R/$n.txt 2> $R/$n-stderr.txt
  echo "exit $?" >> $R/$n.txt; echo "$n: $(grep -E '^wall|^CPU|^busy' $R/$n.txt | tr '\n' ' ')" | tee -a $R/summary.txt
  gzip -9c /tmp/$n.jsonl > $R/$n.jsonl.gz
}
export TILESCHED_SIMULATED_MEASURE_MS=7
for k in 1 2; do
  run sim4-before-$k $D/tilesched-before --simulate --device 0,1,2,3
  run sim4-after-$k $D/tilesched --simulate --device 0,1,2,3
done
MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=67108864 \
  run sim4-before-env $D/tilesched-before --simulate --device 0,1,2,3
unset TILESCHED_SIMULATED_MEASURE_MS
run gpu1-before-1 $D/tilesched-before --device 0
run gpu1-after-1 $D/tilesched --device 0
tar -C /tmp -czf $OUT/builds.tar.gz builds
