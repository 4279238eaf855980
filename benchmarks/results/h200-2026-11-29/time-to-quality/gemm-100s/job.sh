# Issue 49's candidates per GPU-second on one machine: the GEMM set tuned for 100 s by
# the build before the issue's changes (3990988, `before`) and by this one (`both`:
# tune's defaults), one after the other on one H200, each benched against cuBLAS after.
set -u
tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export TILESCHED_BIN=$D/tilesched LD_LIBRARY_PATH=$D/lib TILESCHED_FONT=$D/fonts/DejaVuSans.ttf
G="--shape 4096,4096,4096 --shape 8192,8192,8192 --shape 2048,4096,4096 --shape 2048,14336,4096 --shape 2048,4096,14336 --shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555 --dtype fp16 --out-dtype fp16"
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv > $OUT/gpus.txt
scripts/device-check ttq gemm100 matmul "$G" 100 before both > $OUT/ttq.txt 2>&1
ls -la $OUT
