set -u
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device; export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for r in before after before after; do
  b=$D/wgmma-sketch-gpu-tests; [ $r = before ] && b=$D/wgmma-sketch-before
  timeout 150 $b --ignored --test-threads 1 --nocapture > $OUT/sketch-$r-$(date +%s).txt 2>&1; echo "$r rc $?"
done
cd $OUT && for f in sketch-*.txt; do echo "== $f"; grep -E "m4096_n4096_k4096|m2048_n14336" $f | grep -v split_k | sed 's/.*"wgmma"://' | cut -c1-150; grep "test result" $f; done
