#!/usr/bin/env bash
# Queue builders on a one-GPU host: a GPU worker on the real H200 pinned to 4 cores, the
# tuner to 4 others, with and without a builder on the remaining 8 cores (standing for a
# CPU-only host). 1536 resnet f32 trials, tune's defaults, fresh caches.
set -u
dev=target/device
tar -C target -xJf target/device-pack/device.tar.xz
bin=$PWD/$dev/tilesched
export LD_LIBRARY_PATH=$PWD/$dev/lib CUDA_CACHE_DISABLE=1
d=$OUT/builders; mkdir -p $d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $d/device.txt
nproc >> $d/device.txt
port=6392
$dev/redis/run-redis-server.sh --bind 127.0.0.1 --port $port --save '' --appendonly no > $d/redis.txt 2>&1 &
sleep 1
run() { # NAME BUILDER_CPUS (none: no builder)
  local name=$1 cpus=$2 q="redis://127.0.0.1:6392/$1"
  taskset -c 0-3 $bin worker --queue $q --device 0 --name gpu-$name \
    --cubin-cache /tmp/cubins-gpu-$name 2> $d/worker-$name.txt &
  if [ "$cpus" != none ]; then
    taskset -c $cpus $bin builder --queue $q --name cpu-$name \
      --cubin-cache /tmp/cubins-cpu-$name 2> $d/builder-$name.txt &
  fi
  sleep 2
  local start=$(date +%s)
  rm -rf /tmp/$name.jsonl
  taskset -c 12-15 $bin tune conv2d --network resnet --trials 1536 --queue $q \
    --log /tmp/$name.jsonl --cubin-cache /tmp/cubins-$name 2> $d/$name-stderr.txt | tee $d/$name.txt
  echo "exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - start )) s" >> $d/$name.txt
  pkill -f "worker --queue $q"; pkill -f "builder --queue $q"; sleep 2
  gzip -9c /tmp/$name.jsonl > $d/$name.jsonl.gz
}
run gpu4-builder8 4-11
run gpu4-alone none
$dev/redis/run-redis-cli.sh -p $port shutdown nosave
tar -C $OUT -czf $OUT/builders.tar.gz builders && rm -rf $OUT/builders
ls $OUT
