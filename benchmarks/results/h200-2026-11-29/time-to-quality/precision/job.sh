# Stopping a candidate's timing once its median is known within 0.5% (tune --precision,
# this build, `both`) against the build before it (every candidate to 20 ms, `before`):
# resnet fp16 NHWC batch 1 tuned 45 s each, one after the other on one H200, each benched.
set -u
tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export TILESCHED_BIN=$D/tilesched LD_LIBRARY_PATH=$D/lib TILESCHED_FONT=$D/fonts/DejaVuSans.ttf
R="--network resnet --dtype fp16 --out-dtype fp16 --layout nhwc --batch 1"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv > $OUT/gpus.txt
scripts/device-check ttq resnet-b1-45s conv2d "$R" 45 before both > $OUT/ttq.txt 2>&1
ls -la $OUT
