set -u
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-} TILESCHED_SKETCH_TASKS=m4096_n4096
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for round in 1 2; do
for v in release-cluster plain-arrive; do
  start=$(date +%s)
  timeout 100 $D/wgmma-sketch-$v --ignored --test-threads 1 --nocapture > $OUT/$v-$round.txt 2>&1; echo "$v round $round rc $? $(( $(date +%s) - start )) s"
  grep -E "exact" $OUT/$v-$round.txt | sed 's/"spatial":\[\],"reduction":\[\],"unroll_max_step":0,"vector_width":\[1,1\],//; s/matmul_m4096_n4096_k4096_fp16_out_fp16 //' | grep -v split_k | cut -c1-200
done; done
