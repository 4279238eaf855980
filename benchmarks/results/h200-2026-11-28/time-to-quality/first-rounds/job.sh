# Issue 49, call C, 2 H200s of one host (no 4-GPU host was lent): first rounds of a tenth
# of the budget with the shipped model ("first", this build) against the build before that
# change ("base"), tune's defaults otherwise, side by side: DenseNet-121's 66 conv tasks,
# fp16 NHWC b1, 150 s each (tune only: its bench takes 220 s), GPU 0 and GPU 1.
set -u
tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export TILESCHED_BIN=$D/tilesched LD_LIBRARY_PATH=$D/lib TILESCHED_FONT=$D/fonts/DejaVuSans.ttf RAYON_NUM_THREADS=16
mkdir -p /tmp/res
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv > /tmp/res/gpus.txt
source device-in/curves-lib.sh
python3 benchmarks/onnx/export.py /tmp/onnx --models densenet121 > /tmp/res/export.txt 2>&1
tunev 0 densenet conv2d "$DN" 150 first & tunev 1 densenet conv2d "$DN" 150 base & wait
cd /tmp/res
$TILESCHED_BIN curves conv2d $DN --log first=densenet-first.jsonl --log base=densenet-base.jsonl --title "DenseNet-121 convolutions, fp16 NHWC b1, 150 s, H200: first rounds" --out curves-densenet
for f in *.jsonl; do gzip -9 $f; done
tar -cf $OUT/results-c.tar --exclude='*.jsonl.gz' . ; ls -la $OUT
