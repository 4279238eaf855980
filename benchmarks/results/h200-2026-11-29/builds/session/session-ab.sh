# Issue 51: this session's build (glibc keeping freed memory, 64-bin retrainings) against
# the one before it (2eeb9bd), alternating, one GPU, 1536 resnet f32 trials with tune's
# defaults, fresh caches (the cubin cache and the driver's). One H200 host of 16 cores.
set -u
tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export TILESCHED_BIN=$D/tilesched LD_LIBRARY_PATH=$D/lib CUDA_CACHE_DISABLE=1
R=/tmp/session; rm -rf $R; mkdir -p $R
run() { # NAME BINARY tune-flags...
  local n=$1 b=$2; shift 2
  rm -rf /tmp/$n.jsonl /tmp/cubins-$n
  timeout 150 $b tune conv2d --network resnet --trials 1536 --log /tmp/$n.jsonl --cubin-cache /tmp/cubins-$n "$@" > $R/$n.txt 2> $R/$n-stderr.txt
  echo "exit $?" >> $R/$n.txt; echo "$n: $(grep -E '^wall|^total|^search|^CPU' $R/$n.txt | tr '\n' ' ')" | tee -a $R/summary.txt
  gzip -9c /tmp/$n.jsonl > $R/$n.jsonl.gz
}
for seed in 0 1; do
  run gpu1-before-s$seed $D/tilesched-before --device 0 --seed $seed
  run gpu1-after-s$seed $D/tilesched --device 0 --seed $seed
done
tar -C /tmp -czf $OUT/session.tar.gz session
