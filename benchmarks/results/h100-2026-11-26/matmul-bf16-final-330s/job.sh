set -u
# The bf16 set on this build: tuned BUDGET s on an empty log, then benched.
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
D=$PWD/target/device
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-} TILESCHED_FONT=$D/fonts/DejaVuSans.ttf
B=$D/tilesched
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
S="--shape 4096,4096,4096 --shape 8192,8192,8192 --shape 2048,4096,4096 --shape 2048,14336,4096 --shape 2048,4096,14336 --shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555"
N=matmul-bf16-final
mkdir -p $OUT/$N
rm -f /tmp/mm.jsonl
start=$(date +%s)
$B tune matmul $S --dtype bf16 --out-dtype bf16 --time-budget ${BUDGET:-400} --objective geomean --trials 12000 --log /tmp/mm.jsonl > $OUT/$N/tune.txt 2> $OUT/$N/tune-stderr.txt
echo "tune exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune.txt
head -11 $OUT/$N/tune.txt
start=$(date +%s)
timeout 60 $B bench matmul $S --dtype bf16 --out-dtype bf16 --log /tmp/mm.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune.txt
grep -E "^\| matmul|total|Geometric" $OUT/$N/bench.md | cut -d'|' -f2,4-9 | head -14
python3 benchmarks/scripts/trim_log.py /tmp/mm.jsonl $OUT/$N/tune-log.jsonl.gz > /dev/null
cp target/device-pack/bf16.sh $OUT/$N/job.sh
cd $OUT && tar -czf bf16.tgz * && find . -mindepth 1 -not -name bf16.tgz -exec rm -rf {} +
