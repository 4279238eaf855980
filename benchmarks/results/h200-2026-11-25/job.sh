#!/usr/bin/env bash
# Session job (not committed): issue 31's fp16 600 s EfficientNet-B0 run, both fp16 logs
# benched in one lease, and the PyTorch peer (no compile) on the f32 and fp16 600 s logs.
cd "$(dirname "$0")"
R=/tmp/res; mkdir -p $R
exec > $R/job.log 2>&1
set -x
dev=target/device
[ -x $dev/tilesched ] || tar -C target -xJf target/device-pack/device.tar.xz
export LD_LIBRARY_PATH=$PWD/$dev/lib TILESCHED_FONT=$PWD/$dev/fonts/DejaVuSans.ttf
T=$PWD/$dev/tilesched
p() { echo "$(date -u +%T) $*" >> $R/progress; }
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader > $R/device.txt
p export
python3 benchmarks/onnx/export.py /tmp/onnx --models efficientnet_b0 > $R/export.txt 2>&1
M=/tmp/onnx/efficientnet_b0.onnx
FP="--dtype fp16 --out-dtype fp16 --layout nhwc"
B=benchmarks/results/h100-2026-11-25
mkdir -p $R/fp16-600s $R/fp16-150s $R/f32-600s-peer
p tune
s=$(date +%s)
$T tune conv2d --onnx $M $FP --time-budget 600 --trials 100000 --log /tmp/fp16-600s.jsonl \
  > $R/fp16-600s/tune.txt 2> $R/fp16-600s/tune-stderr.txt
echo "tune exit $?, wall $(( $(date +%s) - s )) s" >> $R/fp16-600s/tune.txt
gzip -9c /tmp/fp16-600s.jsonl > $R/fp16-600s-log.jsonl.gz
gunzip -c $B/onnx-efficientnet-b0-fp16-150s/best-records.jsonl.gz > /tmp/fp16-150s.jsonl
gunzip -c $B/onnx-efficientnet-b0-f32-600s/best-records.jsonl.gz > /tmp/f32-600s.jsonl
for run in fp16-600s fp16-150s; do
  p bench $run
  s=$(date +%s)
  $T bench conv2d --onnx $M $FP --log /tmp/$run.jsonl --out $R/$run 2> $R/$run/bench-stderr.txt
  echo "bench rc $? wall $(( $(date +%s) - s )) s" > $R/$run/bench-wall.txt
done
p peer fp16
$T bench conv2d --onnx $M $FP --log /tmp/fp16-600s.jsonl --out $R/fp16-600s-peer \
  --peer torch --peer-arg=--no-compile --peer-arg=--min-time-ms=40 2> $R/fp16-600s-peer-stderr.txt
echo "rc $?" >> $R/fp16-600s-peer-stderr.txt
p peer f32
$T bench conv2d --onnx $M --log /tmp/f32-600s.jsonl --out $R/f32-600s-peer \
  --peer torch --peer-arg=--no-compile --peer-arg=--min-time-ms=40 2> $R/f32-600s-peer-stderr.txt
echo "rc $?" >> $R/f32-600s-peer-stderr.txt
p done
