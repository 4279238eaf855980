# Issue 49 curves, call B1, 4 H200s of one host, 16 CPU threads per lane, tune's defaults.
# GPUs 0-2: DenseNet-121 fp16 b1 NHWC, its 66 conv tasks for 280 s, cold / transfer /
# both at once (benched in call B2 on the same machine: a bench of 66 tasks takes ~250 s).
# GPU 3: resnet fp16 b8 for 120 s, cold then transfer, each benched (both in call B2).
set -u
tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export TILESCHED_BIN=$D/tilesched LD_LIBRARY_PATH=$D/lib TILESCHED_FONT=$D/fonts/DejaVuSans.ttf RAYON_NUM_THREADS=16
mkdir -p /tmp/res
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv > /tmp/res/gpus.txt
source device-in/curves-lib.sh
( for v in cold transfer; do tunev 3 resnet-b8 conv2d "$R8" 120 $v; benchv 3 resnet-b8 conv2d "$R8" $v; done ) &
python3 benchmarks/onnx/export.py /tmp/onnx --models densenet121 > /tmp/res/export.txt 2>&1
$TILESCHED_BIN workloads --onnx /tmp/onnx/densenet121.onnx > /tmp/res/densenet-workloads.txt 2>&1
for i in 0 1 2; do v=$(echo cold transfer both | cut -d' ' -f$((i+1))); tunev $i densenet conv2d "$DN" 280 $v & done
start=$(date +%s)
while [ -n "$(jobs -r)" ] && [ $(( $(date +%s) - start )) -lt 520 ]; do sleep 5; done
jobs -r; ps aux | grep "tilesched " | grep -v grep | cut -c1-200
cd /tmp/res && for f in *.jsonl; do gzip -9 $f; done; ls -la
for v in cold transfer both; do f=densenet-$v.jsonl.gz; if [ $(stat -c %s $f) -gt 15000000 ]; then split -b 15000000 $f $OUT/$f.part-; else cp $f $OUT/; fi; done
tar -cf $OUT/resnet-b8-logs.tar resnet-b8-*.jsonl.gz; tar -cf $OUT/results-b1.tar --exclude='*.jsonl.gz' . ; ls -la $OUT
