# Issue 49 on 2 H200s of one host, one lane per GPU (16 CPU cores each, as on the
# one-GPU machine). GPU 0: the GEMM set for 240 s from the shipped database and model,
# then resnet fp16 batch 1 for 120 s and the best committed kernels of its tasks benched;
# GPU 1: DenseNet-121 fp16 batch 1 (66 conv tasks) for 300 s.
set -u
tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export TILESCHED_BIN=$D/tilesched LD_LIBRARY_PATH=$D/lib TILESCHED_FONT=$D/fonts/DejaVuSans.ttf RAYON_NUM_THREADS=16
G="--shape 4096,4096,4096 --shape 8192,8192,8192 --shape 2048,4096,4096 --shape 2048,14336,4096 --shape 2048,4096,14336 --shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555 --dtype fp16 --out-dtype fp16"
R="--network resnet --dtype fp16 --out-dtype fp16 --layout nhwc"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv > $OUT/gpus.txt
ttq() { lane=$1; shift; mkdir -p /tmp/res/$lane; CUDA_VISIBLE_DEVICES=$lane OUT=/tmp/res/$lane scripts/device-check ttq "$@" > /tmp/res/$lane-$2.txt 2>&1; }
( ttq 0 gemm240 matmul "$G" 240 both
  ttq 0 resnet-b1 conv2d "$R --batch 1" 120 both
  CUDA_VISIBLE_DEVICES=0 $TILESCHED_BIN bench conv2d $R --batch 1 --log device-in/committed-resnet-fp16-1.jsonl.gz \
    --out /tmp/res/0/committed-b1 > /tmp/res/0/committed-b1.txt 2>&1 ) &
( python3 benchmarks/onnx/export.py /tmp/onnx --models densenet121 > /tmp/res/export.txt 2>&1
  $TILESCHED_BIN workloads --onnx /tmp/onnx/densenet121.onnx > /tmp/res/densenet-workloads.txt 2>&1
  ttq 1 densenet121 conv2d "--onnx /tmp/onnx/densenet121.onnx --dtype fp16 --out-dtype fp16 --layout nhwc" 300 both ) &
# Whatever is done after 550 s comes back: the logs (gzipped) in one archive, the rest
# in another.
start=$(date +%s)
while [ -n "$(jobs -r)" ] && [ $(( $(date +%s) - start )) -lt 550 ]; do sleep 5; done
jobs -r
cd /tmp/res && find . -name '*.jsonl' -exec gzip -9 {} \;
find . -name '*-logs.tar' -o -name '*.jsonl.gz' | tar -cf $OUT/logs.tar -T - && find . -name '*-logs.tar' -delete -o -name '*.jsonl.gz' -delete
tar -cf $OUT/results.tar . && ls -la $OUT
