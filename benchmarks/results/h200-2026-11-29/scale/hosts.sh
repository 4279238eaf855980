#!/usr/bin/env bash
# Issue 51 on a one-GPU host: (1) the local pool against one Redis worker on the real GPU;
# (2) hosts emulated by cores: Redis workers with simulated GPUs (7 ms per candidate, an
# H200's cost with tune's defaults), each pinned to its own 6 cores, the tuner to 4 others.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
nproc >> $OUT/device.txt
lscpu | grep -E "Model name|Thread|Core|Socket" >> $OUT/device.txt
scripts/device-check scale 1536 pool,redis > $OUT/console.txt 2>&1
dev=target/device; bin=$PWD/$dev/tilesched
export LD_LIBRARY_PATH=$PWD/$dev/lib CUDA_CACHE_DISABLE=1 TILESCHED_SIMULATED_MEASURE_MS=7
d=$OUT/hosts; mkdir -p $d
port=6391; q="redis://127.0.0.1:$port/hosts"
$dev/redis/run-redis-server.sh --bind 127.0.0.1 --port $port --save '' --appendonly no > $d/redis.txt 2>&1 &
sleep 1
emulate() { # NAME CPUSET...: one simulated worker per CPUSET, then the tuner on 12-15
  local name=$1; shift; local i=0
  for cpus in "$@"; do
    taskset -c $cpus $bin worker --queue $q --simulate --device 0 --name $name-$i \
      --cubin-cache /tmp/cubins-$name-$i 2> $d/worker-$name-$i.txt &
    i=$((i + 1))
  done
  sleep 2
  local start=$(date +%s)
  rm -rf /tmp/$name.jsonl
  taskset -c 12-15 $bin tune conv2d --network resnet --trials 1536 --queue $q \
    --log /tmp/$name.jsonl --cubin-cache /tmp/cubins-$name 2> $d/$name-stderr.txt | tee $d/$name.txt
  echo "exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - start )) s" >> $d/$name.txt
  pkill -f "worker --queue $q"; sleep 1
  gzip -9c /tmp/$name.jsonl > $d/$name.jsonl.gz
}
emulate hosts1x6 0-5
emulate hosts2x6 0-5 6-11
emulate hosts1x12 0-11
$dev/redis/run-redis-cli.sh -p $port shutdown nosave
tar -C $OUT -czf $OUT/hosts.tar.gz hosts && rm -rf $OUT/hosts
ls $OUT
