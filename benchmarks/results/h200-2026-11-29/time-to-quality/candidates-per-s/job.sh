# Issue 49's candidates per GPU-second for the other target sets, on one machine: each
# set tuned for 60 s by the build before the issue's changes (3990988, `before`) and by
# this one (tune's defaults, `both`), one after the other on one H200, fresh logs and
# caches, NVRTC's driver cache off. Tune only: the rate is the figure here.
set -u
tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export TILESCHED_BIN=$D/tilesched LD_LIBRARY_PATH=$D/lib CUDA_CACHE_DISABLE=1
R="--network resnet --dtype fp16 --out-dtype fp16 --layout nhwc"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv > $OUT/gpus.txt
python3 benchmarks/onnx/export.py /tmp/onnx --models densenet121 > $OUT/export.txt 2>&1
DN="--onnx /tmp/onnx/densenet121.onnx --dtype fp16 --out-dtype fp16 --layout nhwc"
one() { # NAME BUILD OP TASKS
  local s=$(date +%s)
  rm -rf /tmp/c-$1.jsonl /tmp/cubins-$1
  timeout 150 $2 tune $3 $4 --time-budget 60 --trials 1000000 --log /tmp/c-$1.jsonl \
    --cubin-cache /tmp/cubins-$1 > $OUT/$1.txt 2> /dev/null
  echo "tune exit $?, wall $(( $(date +%s) - s )) s" >> $OUT/$1.txt
}
for set in b1 b8 densenet; do
  case $set in b1) op=conv2d; t="$R --batch 1";; b8) op=conv2d; t="$R --batch 8";; densenet) op=conv2d; t="$DN";; esac
  one $set-before $D/tilesched-before $op "$t"
  one $set-both $D/tilesched $op "$t"
done
grep -H -E "^wall|measured|per GPU-second" $OUT/*.txt
