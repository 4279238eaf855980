set -u
# Part C: the three small shapes tuned 300 s more on the final log (resumed), then the
# whole set benched from that log.
mkdir -p target && tar -C target -xJf target/device-pack/device.tar.xz
export LD_LIBRARY_PATH=$PWD/target/device/lib:${LD_LIBRARY_PATH:-} TILESCHED_FONT=$PWD/target/device/fonts/DejaVuSans.ttf
B=$PWD/target/device/tilesched
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
gunzip -c target/device-pack/matmul-fp16-final-2part-log.jsonl.gz > /tmp/mm.jsonl
SMALL="--shape 16,4096,4096 --shape 128,768,3072 --shape 333,777,555"
S="--shape 4096,4096,4096 --shape 8192,8192,8192 --shape 2048,4096,4096 --shape 2048,14336,4096 --shape 2048,4096,14336 $SMALL"
N=matmul-fp16-final-3part
mkdir -p $OUT/$N
start=$(date +%s)
$B tune matmul $SMALL --dtype fp16 --out-dtype fp16 --time-budget ${BUDGET_C:-300} --objective geomean --trials 12000 --resume --log /tmp/mm.jsonl > $OUT/$N/tune-c.txt 2> $OUT/$N/tune-c-stderr.txt
echo "tune C exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune-c.txt
start=$(date +%s)
timeout 100 $B bench matmul $S --dtype fp16 --out-dtype fp16 --log /tmp/mm.jsonl --out $OUT/$N > $OUT/$N/bench-stdout.txt 2> $OUT/$N/bench-stderr.txt
echo "bench exit $?, wall $(( $(date +%s) - start )) s" | tee -a $OUT/$N/tune-c.txt
gzip -9c /tmp/mm.jsonl > $OUT/$N-log.jsonl.gz
head -8 $OUT/$N/tune-c.txt; grep -E "^\| matmul|total|Geometric" $OUT/$N/bench.md | cut -d'|' -f2,4-9 | head -14
cd $OUT && tar -cf $N.tar $N && rm -rf $N
