# Issue 49 curves, call A, 4 H200s of one host, 16 CPU threads per lane, tune's defaults
# (residual retrainings). GPUs 0-2: the GEMM set for 240 s, cold / transfer / both at once,
# each then benched on its GPU. GPU 3: resnet fp16 b1 for 120 s, cold, transfer and both in
# turn; their benches then on GPUs 0-2 at once. Logs gzipped and returned; curves drawn
# here from them.
set -u
tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export TILESCHED_BIN=$D/tilesched LD_LIBRARY_PATH=$D/lib TILESCHED_FONT=$D/fonts/DejaVuSans.ttf RAYON_NUM_THREADS=16
G="--shape 4096,4096,4096 --shape 8192,8192,8192 --shape 2048,4096,4096 --shape 2048,14336,4096 --shape 2048,4096,14336 --shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555 --dtype fp16 --out-dtype fp16"
R="--network resnet --dtype fp16 --out-dtype fp16 --layout nhwc --batch 1"
mkdir -p /tmp/res
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv > /tmp/res/gpus.txt
flags() { case $1 in cold) echo "--no-transfer --cold-model";; transfer) echo "--cold-model";; both) echo "";; esac; }
# tunev GPU NAME OP "TASKS" BUDGET VARIANT
tunev() { gpu=$1 name=$2 op=$3 tasks=$4 budget=$5 v=$6; dir=/tmp/res/$name/$v; mkdir -p $dir; s=$(date +%s)
  CUDA_VISIBLE_DEVICES=$gpu $TILESCHED_BIN tune $op $tasks --time-budget $budget --trials 1000000 --log /tmp/res/$name-$v.jsonl \
    --cubin-cache $(mktemp -d) $(flags $v) > $dir/tune.txt 2> $dir/tune-stderr.txt
  echo "tune exit $?, wall $(( $(date +%s) - s )) s" >> $dir/tune.txt; }
# benchv GPU NAME OP "TASKS" VARIANT
benchv() { gpu=$1 name=$2 op=$3 tasks=$4 v=$5; dir=/tmp/res/$name/$v; s=$(date +%s)
  CUDA_VISIBLE_DEVICES=$gpu $TILESCHED_BIN bench $op $tasks --log /tmp/res/$name-$v.jsonl --out $dir/bench > $dir/bench-stdout.txt 2> $dir/bench-stderr.txt
  echo "bench exit $?, wall $(( $(date +%s) - s )) s" >> $dir/tune.txt; }
for i in 0 1 2; do v=$(echo cold transfer both | cut -d' ' -f$((i+1)))
  ( tunev $i gemm240 matmul "$G" 240 $v; benchv $i gemm240 matmul "$G" $v ) & done
( for v in cold transfer both; do tunev 3 resnet-b1 conv2d "$R" 120 $v; done
  wait_gemm() { while pgrep -f "bench matmul" > /dev/null || pgrep -f "tune matmul" > /dev/null; do sleep 2; done; }
  wait_gemm
  benchv 0 resnet-b1 conv2d "$R" cold & benchv 1 resnet-b1 conv2d "$R" transfer & benchv 2 resnet-b1 conv2d "$R" both & wait ) &
start=$(date +%s)
while [ -n "$(jobs -r)" ] && [ $(( $(date +%s) - start )) -lt 555 ]; do sleep 5; done
jobs -r; ps aux | grep "tilesched " | grep -v grep | cut -c1-200
cd /tmp/res && for f in *.jsonl; do gzip -9 $f; done
tar -cf $OUT/gemm-logs.tar gemm240-*.jsonl.gz; tar -cf $OUT/resnet-logs.tar resnet-*.jsonl.gz; tar -cf $OUT/results.tar --exclude='*.jsonl.gz' . && ls -la $OUT
