# Issue 49 curves, call B2, straight after B1 on the same machine (its /tmp/res kept):
# GPUs 0-2 bench B1's three DenseNet logs at once; GPU 3 tunes resnet fp16 b8 for 120 s
# with tune's defaults (both) and benches it; then the curves of both sets.
set -u
[ -d /tmp/res/densenet ] || { echo "not the machine of call B1: /tmp/res is gone"; exit 3; }
D=$PWD/target/device
export TILESCHED_BIN=$D/tilesched LD_LIBRARY_PATH=$D/lib TILESCHED_FONT=$D/fonts/DejaVuSans.ttf RAYON_NUM_THREADS=16
source device-in/curves-lib.sh
( tunev 3 resnet-b8 conv2d "$R8" 120 both; benchv 3 resnet-b8 conv2d "$R8" both ) &
for i in 0 1 2; do v=$(echo cold transfer both | cut -d' ' -f$((i+1))); benchv $i densenet conv2d "$DN" $v & done
start=$(date +%s)
sleep 20; while pgrep -f "target/device/tilesched" > /dev/null && [ $(( $(date +%s) - start )) -lt 540 ]; do sleep 3; done
jobs -r
cd /tmp/res && gzip -9 resnet-b8-both.jsonl
lb() { for v in cold transfer both; do echo "--log $v=$1-$v.jsonl.gz --bench $v=$1/$v/bench/bench.json"; done; }
$TILESCHED_BIN curves conv2d $DN $(lb densenet) --title "DenseNet-121 convolutions, fp16 NHWC b1, 280 s, H200" --out curves-densenet
$TILESCHED_BIN curves conv2d $R8 $(lb resnet-b8) --title "resnet fp16 NHWC b8, 120 s, H200" --out curves-resnet-b8
cp resnet-b8-both.jsonl.gz $OUT/; tar -cf $OUT/results-b2.tar --exclude='*.jsonl.gz' densenet resnet-b8 curves-densenet curves-resnet-b8; ls -la $OUT
